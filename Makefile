# Understudy — every entry point a newcomer or CI needs.
#   make demo       create .venv, install, run the end-to-end demo
#   make test       create .venv, install test needs (promtool too), run the whole suite
#   make test-fast  skip the slow statistical and fault tests
#   make test-busy  the slow and live tests while a CPU hog keeps every core busy
#                   (tools/test_busy.sh; the hog stops by itself after HOG_MAX_S s,
#                   default 3600, and is killed when pytest ends)
#   make lint       ruff, mypy, and the generated-code staleness check
#   make bench      benchmarks against the stack's raw limits (BENCH_ARGS=--quick: smoke run)
#   make bench-long the same, with 5 minutes of overload for the RSS benchmark
#   make proto      regenerate service/wire/understudy from protos/

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: demo test test-fast test-busy lint bench bench-long proto check-tools clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# promtool (Debian package `prometheus`) is needed by the alerting tests,
# docker-compose (Debian package) by the deployment tests.
check-tools:
	@if ! command -v promtool >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing prometheus (promtool) with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else \
	    echo "promtool is missing: install the Debian package 'prometheus' (needs root)"; \
	  fi; \
	fi
	@if ! command -v docker-compose >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing docker-compose (validates docker/compose.yaml) with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null; \
	  else \
	    echo "docker-compose is missing: install the Debian package 'docker-compose' (needs root)"; \
	  fi; \
	fi

demo: $(STAMP)
	$(VENV)/bin/understudy demo

test: $(STAMP) check-tools
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-busy: $(STAMP) check-tools
	PY=$(PY) tools/test_busy.sh $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check service tests benchmarks tools docker/grafana
	$(VENV)/bin/ruff format --check service tests benchmarks tools docker/grafana
	$(PY) docker/grafana/generate.py --check
	$(VENV)/bin/mypy service
	$(PY) tools/gen_protos.py --check

bench: $(STAMP)
	$(PY) -m benchmarks $(BENCH_ARGS)

bench-long: $(STAMP)
	$(PY) -m benchmarks --long $(BENCH_ARGS)

proto: $(STAMP)
	$(PY) tools/gen_protos.py

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache
