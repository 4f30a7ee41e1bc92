# Newcomer entry points: `make demo` (set up + run the main job) and `make test` (set up + tests).
# Overridable: PYTHON, VENV, TORCH_SPEC (the torch requirement installed when none is present),
# TORCH_INDEX (pip options for that install: on a machine whose pip would fetch the CUDA wheel, use
# TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu" for the CPU build), EXTRAS (the
# optional extras installed with the project; the integrations' tests need theirs).

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
EXTRAS ?= dev,plot,tensorboard,prometheus,wandb,lightning,transformers,hta
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stagefrontier-installed

.PHONY: setup demo test lint typecheck bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# torch is pinned only where none is importable (an existing install is kept). The pinned
	@# 2.13.0 resolves to the CPU build on the registries this project's machines use.
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_INDEX) "$(TORCH_SPEC)"
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
