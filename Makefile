# Two commands matter: `make demo` (the whole pipeline on embedded defaults) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/dagster_home

.PHONY: install demo test ui bench reliability clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m pipelines demo

# The browser tests drive Debian's chromium (never a downloaded browser).
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "The browser tests need Debian's chromium at $(CHROMIUM): run 'sudo apt-get install chromium'"; exit 1; \
	fi

# Heavy tests (the benchmark harness's smoke runs) belong to `make bench`.
test: $(STAMP) $(CHROMIUM)
	$(PY) -m pytest tests -q -m "not heavy" --durations=30

# Every benchmark at full size (12-25 minutes); writes benchmarks/results.json and BENCHMARKS.md.
# The peer loaders get their own virtual environment (benchmarks/.peers-venv), made on first use.
bench: $(STAMP)
	$(PY) -m pytest tests/benchmarks -q -m heavy
	$(PY) -m benchmarks.run --size full
	$(PY) -m benchmarks.sweep_bench

# Every fault, load, bad-input and security class at full size; writes RELIABILITY.md.
reliability: $(STAMP)
	mkdir -p test-artifacts
	RELIABILITY_FULL=1 RELIABILITY_REPORT=test-artifacts/reliability.json $(PY) -m pytest tests/reliability -q
	$(PY) -m tests.reliability.report test-artifacts/reliability.json RELIABILITY.md "make reliability"

ui: $(STAMP)
	$(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

clean:
	rm -rf dagster_home/storage dagster_home/history dagster_home/schedules dagster_home/logs dagster_home/platform dagster_home/.logs_queue dagster_home/.telemetry
