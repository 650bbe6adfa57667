# The two set-up commands of the README: `make demo` (the main job) and `make test` (all tests, with the
# system tools they drive: chromium and nginx); `make docs` serves the documentation site, `make
# docs-build` builds it the way CI does.
# Each builds .venv on first use: torch==2.13.0 first (a CPU build here), then the project and its extras.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.spotswarm-installed
# `make test` runs the tests in two lanes (pytest-xdist): one process runs the tests marked `swarm` one
# after the other, the other runs the rest beside them at the lowest priority (tests/support/lanes.py
# says why). TEST_WORKERS=1 runs every test in one process, one at a time.
TEST_WORKERS ?= 2
PYTEST_ARGS ?= $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)
# The documentation site: where `make docs-build` writes it (ignored by git), where `make docs` serves it.
DOCS_SITE ?= site
DOCS_PORT ?= 8001
# mkdocs-material prints a banner about its end of life (May 2027) on every build; it is noted in
# CONTRIBUTING.md instead of in every CI log.
DOCS_ENV := NO_MKDOCS_2_WARNING=1

.PHONY: demo test lint docs docs-build venv browser nginx clean bench fuzz

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

# What CI checks before the docs and the tests: ruff's rules and formatting, mypy, and the import
# contracts of pyproject.toml ([tool.importlinter]).
LINT_PATHS := orchestrator worker tests bench docs/hooks

lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Every warning fails the build (a broken link or anchor, a page missing from the nav, a reference page
# the code can no longer generate).
docs-build: venv
	$(DOCS_ENV) $(VENV)/bin/mkdocs build --strict --site-dir $(DOCS_SITE)

# Rebuilds when a page changes; the generated reference pages show the code as it was when the server
# started (restart it after changing settings, commands or routes). --livereload is mkdocs' default,
# given explicitly because click 8.3 lost that default (mkdocs issue 4032).
docs: venv
	@echo "spotswarm docs: http://127.0.0.1:$(DOCS_PORT)/ (Ctrl-C stops)"
	$(DOCS_ENV) $(VENV)/bin/mkdocs serve --livereload --dev-addr 127.0.0.1:$(DOCS_PORT)

bench: venv
	$(PY) bench/strategy_overhead.py

# A long fuzzing session of the REST API (the test suite runs a small bounded one).
fuzz: venv
	$(PY) bench/fuzz_api.py --examples 300

clean:
	rm -rf $(VENV) data site
