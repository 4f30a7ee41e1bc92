# Newcomer entry points: `make demo` (set up what the demo needs, then run it) and `make test`
# (set up everything the tests need, then lint, type-check, build the docs and test).
# Overridable: PYTHON, VENV, TORCH_SPEC (the torch requirement installed when none is present),
# TORCH_INDEX (pip options for that install: on a machine whose pip would fetch the CUDA wheel, use
# TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu" for the CPU build), DEMO_EXTRAS
# (the extras the demo needs) and EXTRAS (every extra: the integrations' tests need theirs).

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
DEMO_EXTRAS ?= plot,router
EXTRAS ?= dev,docs,plot,router,tensorboard,prometheus,otel,wandb,lightning,transformers,hta
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.stagefrontier-demo
STAMP := $(VENV)/.stagefrontier-installed

.PHONY: setup demo test lint typecheck docs schemas bench clean

# install(extras, what it is for, rough time): the venv, torch when none is importable (an
# existing install is kept; the pinned 2.13.0 resolves to the CPU build on the registries this
# project's machines use), then the project in editable mode with the given extras. Each step
# says what it does and pip shows what it collects and installs (SETUP_PIP_FLAGS=-q quiets it).
SETUP_PIP_FLAGS ?= --progress-bar on
define install
	@test -x $(PY) || { echo "setup: creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@$(PY) -c "import torch" 2>/dev/null || { \
	  echo "setup: installing $(TORCH_SPEC) (CPU build: about 0.9 GB installed, 20 s from a local wheel, longer to download)"; \
	  $(PY) -m pip install $(SETUP_PIP_FLAGS) $(TORCH_INDEX) "$(TORCH_SPEC)"; }
	@echo "setup: installing stagefrontier[$(1)] for $(2) ($(3))"
	@$(PY) -m pip install $(SETUP_PIP_FLAGS) -e ".[$(1)]"
	@echo "setup: done"
endef

$(DEMO_STAMP): pyproject.toml
	$(call install,$(DEMO_EXTRAS),the demo,matplotlib plus msgspec and isal: about 0.1 GB and 10 s)
	@touch $(DEMO_STAMP)

$(STAMP): pyproject.toml
	$(call install,$(EXTRAS),the tests,dev tools and every integration: about 0.8 GB and 2 min)
	@touch $(STAMP) $(DEMO_STAMP)

setup: $(STAMP)

DEMO_ARGS ?= --ranks 4 --steps 120 --window 20 --fault data@2:120ms --router --out stagefrontier-demo

demo: $(DEMO_STAMP)
	$(VENV)/bin/stagefrontier demo $(DEMO_ARGS)

# $(call timed,WHAT,COMMAND): print COMMAND, run it, then print how long WHAT took (the CI log
# keeps each check's time); a failing command still fails the target.
define timed
	@echo '$(2)'
	@start=$$(date +%s.%N); $(2); status=$$?; \
	  echo "make: $(1) took $$(awk "BEGIN {printf \"%.1f\", $$(date +%s.%N) - $$start}") s"; \
	  exit $$status
endef

lint: $(STAMP)
	$(call timed,ruff check,$(VENV)/bin/ruff check src tests benchmarks docs/hooks)
	$(call timed,ruff format --check,$(VENV)/bin/ruff format --check src tests benchmarks docs/hooks)

typecheck: $(STAMP)
	$(call timed,mypy,$(VENV)/bin/mypy)

# The documentation site (mkdocs.yml): --strict fails on a broken link, a missing API reference
# or a docstring the reference cannot parse. Written to site/.
schemas: $(STAMP)
	PYTHONPATH=src $(VENV)/bin/python tests/schema_support.py

docs: $(STAMP)
	$(call timed,the docs build,NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet)

# The three checks run side by side (mypy and the docs build each keep one core busy for tens of
# seconds; each check's output is printed whole when it ends), then the suite, if they passed.
# PYTEST_WORKERS=0 (the default) runs the suite in one process; PYTEST_WORKERS=2 on two
# pytest-xdist workers, each test file whole on one (--dist loadfile: a file's shared real-rank
# job runs once): about 13 min on a quiet 2-core machine against 20, but not yet green under
# load (benchmarks/results/suite_under_load.md; docs/ARCHITECTURE.md, The test suite). pyproject.toml adds --durations=20
# and a per-test timeout. The site the docs step just built serves tests/test_docs_from_disk.py
# (STAGEFRONTIER_BUILT_SITE), which builds its own when run without it.
PYTEST_WORKERS ?= 0

test: $(STAMP)
	@$(MAKE) --no-print-directory -j3 --output-sync=target lint typecheck docs
	$(call timed,pytest,STAGEFRONTIER_BUILT_SITE=$(CURDIR)/site $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile)

bench: $(STAMP)
	$(PY) benchmarks/analyzer.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis site
