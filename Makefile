# `make test` and `make demo` do all set-up on a fresh machine: nothing needs installing by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint unit demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

unit: $(STAMP)
	$(BIN)/pytest

test: lint unit

demo: $(STAMP)
	$(BIN)/python deploy/local/demo.py

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
