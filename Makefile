# The two commands:  `make demo` runs the main job,  `make test` runs the tests.
# Each installs what it needs on a fresh machine: a virtualenv with the pinned
# Python packages (requirements*.txt) and Azurite from npm (package-lock.json).

# Python 3.13: the version the app runs on in Azure (infra/app/function-app.bicep) and the one
# Microsoft's azure-functions-runtime, which runs the functions here too, needs. PYTHON=... picks
# one; else devtools/find-python looks on PATH and among pyenv's installed versions.
PYTHON ?= $(shell devtools/find-python)
VENV   ?= .venv
PY     := $(VENV)/bin/python
define NO_PYTHON
No Python 3.13 found (on PATH as python3.13 or python3, or installed by pyenv).
Install one, then run make again, for example:
  pyenv install 3.13        (https://github.com/pyenv/pyenv)
  sudo apt-get install python3.13 python3.13-venv     (Debian 13, Ubuntu 24.10+; or the deadsnakes PPA)
  brew install python@3.13  (macOS)
or name one: make PYTHON=/path/to/python3.13 ...
endef
export NO_PYTHON

.PHONY: demo test run soak bench setup browser clean python-check

setup: python-check $(VENV)/.installed node_modules/.installed local.settings.json

# A virtualenv made with another Python is made again.
python-check:
	@if [ -z "$(PYTHON)" ]; then echo "$$NO_PYTHON" >&2; exit 1; fi
	@$(PYTHON) -c 'import sys; sys.exit("make needs Python 3.13 (PYTHON=$(PYTHON) is " + sys.version.split()[0] + ")") if sys.version_info[:2] != (3, 13) else None'
	@if [ -e $(PY) ] && ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' 2>/dev/null; then \
		echo "$(VENV) was made with another Python: making it again with $(PYTHON)"; rm -rf $(VENV); fi

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# The real local.settings.json is git-ignored; start from the committed template.
local.settings.json:
	cp local.settings.template.json local.settings.json

# The operator page's browser test (tests/e2e/test_operator_page.py) drives Debian's
# headless Chromium and its driver, never a downloaded browser: installed here when
# missing and run as root (CI on Debian 12); otherwise this says how, and the test fails.
CHROMIUM_PACKAGES := chromium chromium-driver

browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing $(CHROMIUM_PACKAGES) for the operator page's browser test"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(CHROMIUM_PACKAGES); \
	else \
		echo "The operator page's browser test needs Chromium: sudo apt-get update && sudo apt-get install -y --no-install-recommends $(CHROMIUM_PACKAGES)"; \
	fi

# Two workers (pytest-xdist), each with its own Azurite and Service Bus emulator: the
# end-to-end tests mostly wait on timers. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2

test: setup browser
	$(PY) -m pytest --numprocesses $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

demo: setup
	$(PY) -m devtools.demo $(DEMO_ARGS)

run: setup
	$(PY) -m devtools.run $(RUN_ARGS)

soak: setup
	$(PY) -m benchmarks.soak $(SOAK_ARGS)

# Benchmarks on the local stack; writes BENCHMARKS.md (see docs/benchmarks.md).
# BENCH_ARGS="--quick" for a ~5-minute smoke run, "--sweep-100k" for the long sweep step.
bench: setup
	$(PY) -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) node_modules .pytest_cache
