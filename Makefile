# flowkit: the two commands a newcomer needs are `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-test

.PHONY: demo test lint bench bench-smoke bench-dbos clean venv

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-base: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	touch $@

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e ".[test,dev,postgres,crypto,ui,otel]"
	touch $@ $(VENV)/.installed-base

venv: $(STAMP)

demo: $(VENV)/.installed-base
	$(BIN)/python samples/demo.py

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check flowkit flowkit_testing tests samples bench
	$(BIN)/mypy

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[bench]"
	touch $@

bench: $(BENCH_STAMP)
	$(BIN)/python bench/run.py

bench-dbos: $(BENCH_STAMP)
	$(BIN)/python bench/dbos_bench.py

bench-smoke: $(STAMP)
	$(BIN)/python bench/run.py --smoke

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
