# flowkit: the two commands a newcomer needs are `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-test

.PHONY: demo test browser-deps lint bench bench-smoke bench-dbos bench-compare clean venv

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

test: $(STAMP) browser-deps
	$(BIN)/python -m pytest -q

# Debian's headless Chromium + driver for the dashboard's browser tests: installed when missing
# and we run as root with apt-get (best effort, like .ci/run); otherwise those tests skip.
browser-deps:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      chromium chromium-driver) || echo "warning: could not install chromium"; \
	  else \
	    echo "note: no /usr/bin/chromium + /usr/bin/chromedriver: the browser tests skip" \
	      "(apt-get install chromium chromium-driver)"; \
	  fi; \
	fi

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
	$(BIN)/python bench/compare.py --base HEAD --rounds 1 --smoke

# side by side with a base commit: make bench-compare BASE=<commit> [ROUNDS=5]
ROUNDS ?= 5
bench-compare: $(STAMP)
	@test -n "$(BASE)" || { echo "usage: make bench-compare BASE=<commit> [ROUNDS=5]"; exit 2; }
	$(BIN)/python bench/compare.py --base "$(BASE)" --rounds $(ROUNDS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
