# The two set-up commands of README: `make demo` (the main job) and `make test` (all tests, with the
# system tools they drive: chromium and nginx).
# Each builds .venv on first use: torch==2.13.0 first (a CPU build here), then the project and its extras.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.spotswarm-installed
PYTEST_ARGS ?=

.PHONY: demo test lint venv browser nginx clean bench fuzz

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[all]'
	touch $(STAMP)

# Debian's chromium for the status-page browser tests (Playwright drives it; no browser download).
browser:
	@command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium >/dev/null)

# Debian's nginx for the TLS proxy tests, which run their own nginx process on the deployment's
# configuration (deploy/nginx/nginx.conf); the package's own service is not needed.
nginx:
	@test -x /usr/sbin/nginx || command -v nginx >/dev/null || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx >/dev/null)

demo: venv
	$(VENV)/bin/spotswarm demo

test: venv browser nginx
	$(PY) -m pytest $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check orchestrator worker tests bench
	$(VENV)/bin/mypy

bench: venv
	$(PY) bench/strategy_overhead.py

# A long fuzzing session of the REST API (the test suite runs a small bounded one).
fuzz: venv
	$(PY) bench/fuzz_api.py --examples 300

clean:
	rm -rf $(VENV) data
