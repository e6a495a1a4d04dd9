# rocmft — developer and user entry points. `make help` lists them.
# Everything runs in a local virtual environment (.venv) with the pinned stack (constraints.txt).

SHELL        := /bin/bash
PYTHON       ?= python3
VENV         ?= .venv
BIN          := $(VENV)/bin
SHARED       ?= $(abspath ../shared)
PYTEST_ARGS  ?=

.DEFAULT_GOAL := help
.PHONY: help venv train render check test lint format docs lock clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@

venv: $(BIN)/.installed ## create .venv with the pinned training stack (about 3 min the first time)

train: venv ## train on the built-in default (tiny model, demo data); settings come from the environment
	$(BIN)/rocmft train

render: venv ## render and validate the configs into OUTPUT_DIR/rocmft without training
	$(BIN)/rocmft render

check: venv ## render, validate and run the health checks without training
	$(BIN)/rocmft check

test: venv lint ## lint, then the whole test suite (includes real CPU training runs; ~5 min)
	SHARED_DIR=$(SHARED) $(BIN)/python -m pytest $(PYTEST_ARGS)

lint: venv ## ruff (lint and format check)
	$(BIN)/ruff check entrypoint tests
	$(BIN)/ruff format --check entrypoint tests

format: venv ## apply ruff's formatting and safe fixes
	$(BIN)/ruff format entrypoint tests
	$(BIN)/ruff check --fix entrypoint tests

docs: venv ## regenerate the README's variable reference and docs/training-arguments.md from the code
	$(BIN)/python -m rocmft.envdoc --write README.md docs/training-arguments.md

lock: venv ## rewrite constraints.txt from the current environment (after changing pyproject.toml)
	{ sed -n '1,2p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -v '^rocmft'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean: ## remove .venv, caches and saves/
	rm -rf $(VENV) .pytest_cache .ruff_cache saves *.egg-info entrypoint/*.egg-info
