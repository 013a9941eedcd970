# The two commands of the README: `make demo` and `make test`. Both work on a machine with nothing
# installed by hand: they create .venv, install the pinned CPU torch FIRST (an unpinned torch would
# resolve to a multi-GB CUDA build), then layerscope itself.

PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test lint typecheck unit browser native bench clean compat

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.torch: | $(BIN)/python
	$(PIP) install "torch==$(TORCH_VERSION)"
	touch $@

$(VENV)/.base: pyproject.toml $(VENV)/.torch
	$(PIP) install -e .
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.base
	$(PIP) install -e ".[test]"
	touch $@

# The native reader (C++, compiled against the installed torch, ~15 s once; a no-op when built).
# Best effort: without a compiler, post-processing reads through torch's Python bindings instead.
native: $(VENV)/.base
	@$(BIN)/layerscope native build || \
	  echo "layerscope: native reader not built; post-processing uses torch's Python bindings (slower)"

demo: native
	$(BIN)/layerscope profile --memory

lint: $(VENV)/.test
	$(BIN)/ruff check src tests benchmarks

typecheck: $(VENV)/.test
	$(BIN)/mypy

# The HTML report's browser tests need Debian's chromium. Installing it is best effort (root and
# apt only): without it those tests skip with their reason and everything else still runs.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    (apt-get install -y -qq chromium >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1)); } || \
	  echo "chromium not installed: the HTML report's browser tests will skip"

unit: $(VENV)/.test browser native
	$(BIN)/python -m pytest

test: lint typecheck unit

bench: native
	$(BIN)/python benchmarks/postprocess.py --steps 20
	$(BIN)/python benchmarks/overhead.py

# The suite on another torch, in a throwaway venv (not part of `make test`): make compat TORCH=2.4.1
# torch is pinned in both installs so that no dependency can move it.
TORCH ?= $(TORCH_VERSION)
COMPAT := .venv-compat
compat:
	rm -rf $(COMPAT)
	$(PYTHON) -m venv $(COMPAT)
	$(COMPAT)/bin/python -m pip --disable-pip-version-check -q install "torch==$(TORCH)"
	$(COMPAT)/bin/python -m pip --disable-pip-version-check -q install -e ".[test]" "torch==$(TORCH)"
	$(COMPAT)/bin/python -m pytest -p no:cacheprovider

clean:
	rm -rf $(VENV) $(COMPAT) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
