# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The named datasets: a data folder beside the checkout when there is one, else gnnpipe's own
# default (the user cache, downloaded once from each dataset's public source).
SHARED_DATA := $(abspath ../shared/data)
ifneq ($(wildcard $(SHARED_DATA)),)
export GNNPIPE_DATA ?= $(SHARED_DATA)
endif

.PHONY: demo test test-fast test-gpu install lint docs notebook bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev,docs]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/gnnpipe demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

# ruff; the layers contract (pyproject.toml [tool.importlinter]); mypy (pyproject.toml [tool.mypy])
lint: $(STAMP)
	$(BIN)/ruff check gnnpipe dashboard tests benchmarks tools docs
	$(BIN)/lint-imports
	$(BIN)/mypy

# The documentation site (Sphinx, PyData theme, executed notebooks): warnings are errors; then
# the site is opened in headless Chromium (tests/docs).
docs: $(STAMP)
	rm -rf docs/_build/html
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	$(BIN)/python -m pytest -q tests/docs
	@echo "docs: open docs/_build/html/index.html"

# JupyterLab on the notebooks (installs the front end on first use).
notebook: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[notebook]"
	$(BIN)/jupyter lab notebooks/

clean:
	rm -rf $(VENV) runs .pytest_cache docs/_build docs/_generated
