# Two commands matter: `make demo` (the whole pipeline on embedded defaults) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/dagster_home

.PHONY: install demo test test-all ui bench reliability images images-lock test-images clean

# uv installs the same pins as pip from the same places, several times faster (make demo's budget
# includes the install); .ci/uv_args.py hands it pip's configuration (local wheels, mirrors,
# constraints), which uv does not read. unsafe-best-match picks across indexes as pip does.
# --compile-bytecode writes the .pyc files at install, as pip does: uv leaves them to the first
# import otherwise, and where Python may not write them (PYTHONDONTWRITEBYTECODE, read-only
# site-packages) every process of the demo and its torchrun workers compiles what it imports again
# (make demo from no .venv: 4 min 21 s without, 2 min 59 s with, of which 11 s more install).
# Where uv cannot be installed, pip does the install (it says so).
UV := uv==0.13.9
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if $(PY) -m pip install --quiet --upgrade pip $(UV); then \
		$(PY) -m uv pip install --python $(PY) --quiet --compile-bytecode --index-strategy unsafe-best-match \
			$$($(PY) .ci/uv_args.py) -c constraints.txt -e '.[dev]'; \
	else \
		echo "uv could not be installed; installing with pip (slower)"; \
		$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'; \
	fi
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

# The suites run in parallel, one pytest-xdist worker per core (TEST_WORKERS=1 for one at a time);
# each test has its own tmp_path home, instance and free ports, so workers never share state.
# --dist loadfile keeps a file's tests on one worker: module-scoped servers (lakeFS, SeaweedFS,
# the browser) start once per file, not once per worker.
TEST_WORKERS ?= auto
PYTEST := $(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist loadfile

# A newcomer's suite, under 15 minutes on 2 cores: every layer (unit, real torchrun, real HTTP,
# real S3 and Postgres, one browser check, the docs' examples). Tests marked `full` (more cases of
# paths make test already covers end to end) wait for `make test-all`; heavy ones for `make bench`.
test: $(STAMP) $(CHROMIUM)
	$(PYTEST) -m "not heavy and not full" --durations=20

# The complete suite: make test's tests and the `full` ones (what CI runs, .ci/run).
test-all: $(STAMP) $(CHROMIUM)
	$(PYTEST) -m "not heavy" --durations=30

# The training and code-location images, built here from their Dockerfiles with buildah (as root:
# debootstrap makes the base, helm/images/local_build.py says what stands in for the registry base
# and the torch index), cached by their inputs; then the smoke tests inside them, run as their pods
# would (tests/k8s/test_built_images.py), and the pod simulation's own tests with every pod inside
# the training image (POD_SIM_IMAGE, tests/k8s/local_cluster.py). CI runs it after make test-all
# (.ci/run); from an empty image store the builds take about 6 min.
BUILDAH := /usr/bin/buildah
$(BUILDAH):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap >/dev/null; \
	else \
		echo "Building images here needs root and Debian's buildah and debootstrap: 'sudo apt-get install buildah debootstrap'"; exit 1; \
	fi

images: $(STAMP) $(BUILDAH)
	mkdir -p test-artifacts
	$(PY) helm/images/local_build.py --json test-artifacts/images.json

# The images' locks, made by uv pip compile (helm/images/lock.py): training.lock.txt from
# training.requirements.in, training.cuda.lock.txt (what PyPI's CUDA torch adds), and
# code-location.lock.txt from pyproject.toml under constraints.txt. After editing any of those, run
# this and commit the locks (tests/k8s/test_image_lock.py fails while a lock is behind them).
images-lock: $(STAMP)
	$(PY) helm/images/lock.py

test-images: images
	$(PY) -m pytest tests/k8s/test_built_images.py -q -m heavy -p no:xdist
	POD_SIM_IMAGE=$$($(PY) -c "import json; print(json.load(open('test-artifacts/images.json'))['training']['image'])") \
		$(PY) -m pytest tests/k8s/test_pod_simulation.py tests/k8s/test_elastic_pods.py -q -p no:xdist \
		-W error::tests.k8s.local_cluster.PodImageFallback

# The harness's smoke runs, then every row of the table at full size in one run (sweeps and FSDP
# memory included; under 30 minutes); writes benchmarks/results.json and BENCHMARKS.md's table.
# The peer loaders get their own virtual environment (benchmarks/.peers-venv), made on first use.
bench: $(STAMP)
	$(PY) -m pytest tests/benchmarks -q -m heavy
	$(PY) -m benchmarks.run --size full

# Every fault, load, bad-input and security class at full size, then the soak (tests/reliability/soak):
# SOAK_MINUTES of mixed load and random faults on the local platform, then SOAK_K8S_MINUTES (a third
# of it unless set) through the pod simulation; SOAK_SEED=N replays a soak's faults. Writes RELIABILITY.md.
SOAK_MINUTES ?= 30
reliability: $(STAMP)
	mkdir -p test-artifacts
	rm -f test-artifacts/soak.json
	RELIABILITY_FULL=1 RELIABILITY_REPORT=test-artifacts/reliability.json SOAK_MINUTES=$(SOAK_MINUTES) \
		SOAK_REPORT=test-artifacts/soak.json $(PY) -m pytest tests/reliability -q
	$(PY) -m tests.reliability.report test-artifacts/reliability.json RELIABILITY.md "make reliability" \
		--soak test-artifacts/soak.json

# The Dagster UI and, beside it, the TensorBoard that every training links its live curves to
# (pipelines/local_ui.py); Ctrl+C stops both. Ports: make ui UI_PORT=3001 TENSORBOARD_PORT=6007.
UI_HOST ?= 127.0.0.1
UI_PORT ?= 3000
TENSORBOARD_PORT ?= 6006
ui: $(STAMP)
	$(PY) -m pipelines.local_ui --host $(UI_HOST) --port $(UI_PORT) --tensorboard-port $(TENSORBOARD_PORT)

clean:
	rm -rf dagster_home/storage dagster_home/history dagster_home/schedules dagster_home/logs dagster_home/platform dagster_home/.logs_queue dagster_home/.telemetry
