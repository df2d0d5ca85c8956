# Two commands on a fresh machine: `make demo` and `make test`.
# Each target creates .venv with `python3 -m venv` when it is missing and installs
# the project with its pinned dependencies (constraints.txt), showing pip's progress.
# `make demo ARGS=--no-dashboard` runs the demo headless (ARGS go to `treellm demo`);
# `make dist` builds the sdist and the wheel into dist/.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.treellm-installed

ARGS   ?=

.PHONY: demo test lint bench install clean constraints browser js frameworks wheelhouse dist

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing treellm and its pinned dependencies into $(VENV) (a minute or two the first time)"
	$(BIN)/python -m pip install --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $@

demo: $(STAMP)
	$(BIN)/treellm demo $(ARGS)

# The sdist, then the wheel built from it (the dashboard and sample_traces inside), offline:
# hatchling and build come with .[dev]. `pip install dist/treellm-*.whl` installs it elsewhere.
dist: $(STAMP)
	$(BIN)/python -m build --no-isolation --outdir dist .

# The browser test drives Debian's chromium; install it when missing and apt-get is usable (root, as on CI).
browser:
	@command -v chromium >/dev/null 2>&1 || [ -n "$$CHROMIUM_PATH" ] || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "no chromium: the browser test will be skipped (unless TREELLM_REQUIRE_BROWSER=1)"

JS_STAMP := tests/js/node_modules/.package-lock.json

# The official JavaScript OTLP exporter driven by tests/test_collector.py (pinned by tests/js/package-lock.json).
js: $(JS_STAMP)
$(JS_STAMP): tests/js/package.json tests/js/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "no npm: the JavaScript exporter test will be skipped (unless TREELLM_REQUIRE_NODE=1)"; exit 0; }; \
	npm ci --prefix tests/js --no-audit --no-fund --loglevel=error

# One virtual environment per real agent framework (tests/frameworks/<name>/), built when
# missing or when its pins change; the framework tests drive them and never skip.
FRAMEWORKS := $(patsubst tests/frameworks/%/requirements.txt,%,$(wildcard tests/frameworks/*/requirements.txt))
FW_STAMPS  := $(FRAMEWORKS:%=.venv-fw/%/.installed)

frameworks: $(FW_STAMPS)

# Each also holds treellm's core install (no extras), for the adapters' tests.
.venv-fw/%/.installed: tests/frameworks/%/requirements.txt tests/frameworks/%/constraints.txt pyproject.toml
	rm -rf .venv-fw/$*
	$(PYTHON) -m venv .venv-fw/$*
	.venv-fw/$*/bin/python -m pip install --quiet --disable-pip-version-check \
	  -r tests/frameworks/$*/requirements.txt -e . -c tests/frameworks/$*/constraints.txt
	@touch $@

# Wheels of treellm's dependencies (every extra), pinned: the slim-install and wheel-install
# tests and the install-size benchmark build fresh virtual environments from them offline.
# treellm's own wheel is removed: each test builds it from the tree it tests, never a stale copy.
WHEELHOUSE := .wheelhouse/.complete
wheelhouse: $(WHEELHOUSE)
$(WHEELHOUSE): pyproject.toml constraints.txt | $(STAMP)
	$(BIN)/python -m pip wheel --quiet --disable-pip-version-check -c constraints.txt -w .wheelhouse '.[all]'
	rm -f .wheelhouse/treellm-*.whl
	@touch $@

test: $(STAMP) browser js frameworks wheelhouse
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check treellm dashboard tests benchmarks
	$(BIN)/ruff format --check treellm dashboard tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Re-pin every dependency from a fresh resolution (run by hand, then commit).
constraints:
	rm -rf .venv-pin && $(PYTHON) -m venv .venv-pin
	.venv-pin/bin/pip install --quiet -e '.[dev]'
	.venv-pin/bin/pip freeze --exclude-editable | grep -v '^treellm' > constraints.txt
	rm -rf .venv-pin

clean:
	rm -rf $(VENV) .venv-fw .wheelhouse dist .pytest_cache .mypy_cache .ruff_cache tests/js/node_modules
