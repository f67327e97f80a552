# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-gpu install lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
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
	$(BIN)/ruff check gnnpipe dashboard tests benchmarks tools
	$(BIN)/lint-imports
	$(BIN)/mypy

clean:
	rm -rf $(VENV) runs .pytest_cache
