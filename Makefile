# Newcomer entry points: `make demo` (set up + run the main job) and `make test` (set up + tests).
# Overridable: PYTHON, VENV, TORCH_SPEC (the torch requirement installed when none is present),
# EXTRAS (the optional extras installed with the project; the integrations' tests need theirs).

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,plot,tensorboard,prometheus,wandb,lightning,transformers,hta
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stagefrontier-installed

.PHONY: setup demo test lint typecheck bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# A CPU build of torch is pinned only where no torch is importable; set TORCH_SPEC to override.
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@touch $(STAMP)

setup: $(STAMP)

DEMO_ARGS ?= --ranks 4 --steps 120 --window 20 --fault data@2:120ms --out stagefrontier-demo

demo: $(STAMP)
	$(VENV)/bin/stagefrontier demo $(DEMO_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy

test: $(STAMP) lint typecheck
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/analyzer.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
