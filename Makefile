# The two set-up commands of the README: `make demo` (the main job) and `make test` (all tests, with the
# system tools they drive: chromium and nginx); `make docs` serves the documentation site, `make
# docs-build` builds it the way CI does.
# Each builds .venv on first use: torch==2.13.0 first (a CPU build here), then the project and its extras,
# constraints.txt pinning torch so that nothing replaces it.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.spotswarm-installed
# `make test` runs the tests in lanes (pytest-xdist, three processes): two take the modules of tests
# marked `swarm`, one module at a time each, the third runs the rest beside them at the lowest priority
# (tests/support/lanes.py says why). TEST_WORKERS=1 runs every test in one process, one at a time.
TEST_WORKERS ?= 3
PYTEST_ARGS ?= $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)
# The documentation site: where `make docs-build` writes it (ignored by git), where `make docs` serves it.
DOCS_SITE ?= site
DOCS_PORT ?= 8001
# mkdocs-material prints a banner about its end of life (May 2027) on every build; it is noted in
# CONTRIBUTING.md instead of in every CI log.
DOCS_ENV := NO_MKDOCS_2_WARNING=1

.PHONY: demo test lint docs docs-build venv test-tools browser nginx clean bench fuzz

venv: $(STAMP)

# pip fetches torch (from where pip is configured to find it) and uv installs it and then the rest: uv
# downloads and installs in parallel (a cold build of .venv: about 35 s against pip's 100 s), and
# --compile-bytecode writes the .pyc files pip would have, which processes cannot write themselves where
# PYTHONDONTWRITEBYTECODE is set (each would compile torch again at every start).
UV_INSTALL = $(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv
	rm -rf $(VENV)/torch-wheel
	$(PY) -m pip download -q --no-deps --dest $(VENV)/torch-wheel torch==2.13.0
	$(UV_INSTALL) $(VENV)/torch-wheel/torch-*.whl
	rm -rf $(VENV)/torch-wheel
	$(UV_INSTALL) -c constraints.txt -e '.[all]'
	touch $(STAMP)

# The Debian packages the tests drive, installed when missing, in one apt-get for both: chromium for the
# status-page browser tests (Playwright drives it; no browser download) and nginx for the TLS proxy
# tests, which run their own nginx process on the deployment's configuration (deploy/nginx/nginx.conf;
# the package's own service is not needed). `make browser` and `make nginx` install one of them.
HAS_CHROMIUM := command -v chromium >/dev/null
HAS_NGINX := test -x /usr/sbin/nginx || command -v nginx >/dev/null
APT_INSTALL = apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q

test-tools:
	@missing=""; $(HAS_CHROMIUM) || missing="chromium"; $(HAS_NGINX) || missing="$$missing nginx"; \
	if [ -n "$$missing" ]; then $(APT_INSTALL) $$missing >/dev/null; fi

browser:
	@$(HAS_CHROMIUM) || ($(APT_INSTALL) chromium >/dev/null)

nginx:
	@$(HAS_NGINX) || ($(APT_INSTALL) nginx >/dev/null)

demo: venv
	$(VENV)/bin/spotswarm demo

# The tests start hundreds of Python processes that import our packages: their .pyc files are written
# first, which the processes cannot do themselves where PYTHONDONTWRITEBYTECODE is set.
test: venv test-tools
	$(PY) -m compileall -q orchestrator worker tests bench >/dev/null
	$(PY) -m pytest $(PYTEST_ARGS)

# What CI checks beside the tests: ruff's rules and formatting, mypy, and the import
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
