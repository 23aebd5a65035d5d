# The two commands:  `make demo` runs the main job,  `make test` runs the tests.
# Each installs what it needs on a fresh machine: a virtualenv with the pinned
# Python packages (requirements*.txt) and Azurite from npm (package-lock.json).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: demo test run soak bench setup clean

setup: $(VENV)/.installed node_modules/.installed local.settings.json

$(VENV)/.installed: requirements.txt requirements-dev.txt
	@$(PYTHON) -c 'import sys; sys.exit("Python 3.11 or newer is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# The real local.settings.json is git-ignored; start from the committed template.
local.settings.json:
	cp local.settings.template.json local.settings.json

# Two workers (pytest-xdist), each with its own Azurite and Service Bus emulator: the
# end-to-end tests mostly wait on timers. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2

test: setup
	$(PY) -m pytest --numprocesses $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

demo: setup
	$(PY) -m devtools.demo $(DEMO_ARGS)

run: setup
	$(PY) -m devtools.run $(RUN_ARGS)

soak: setup
	$(PY) -m benchmarks.soak $(SOAK_ARGS)

# Benchmarks on the local stack; writes BENCHMARKS.md (see docs/benchmarks.md).
# BENCH_ARGS="--quick" for a ~4-minute smoke run, "--sweep-100k" for the long sweep step.
bench: setup
	$(PY) -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) node_modules .pytest_cache
