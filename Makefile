# The two commands: `make run` (install and start OSTE on SQLite) and `make test` (the whole suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test test-slow lint install dev openapi clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed

dev: $(VENV)/.dev-installed

run: install
	$(BIN)/oste serve

lint: dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# `make test` runs the suite on two workers (pytest-xdist): each test file stays on one worker, so a
# file's shared servers are built once and its tests never overlap. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2

test: lint
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

test-slow: dev
	$(BIN)/pytest -m slow -s

openapi: install
	$(BIN)/oste openapi -o openapi/openapi.yaml

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis .schemathesis
