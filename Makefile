# Helmhive: the two commands of the README, and their building blocks.
# Everything is set up from scratch on a fresh machine: a virtual environment, the
# install, and the control-plane binaries (built from the Go module proxy, cached in
# ~/.cache/helmhive by version).

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.helmhive-installed
TEST_WORKERS ?= 2
# Extra pytest options for both tiers, e.g. PYTEST_EXTRA=--junitxml=... to keep every test's time.
PYTEST_EXTRA ?=
E2E_EXTRA ?=

.PHONY: demo test e2e lint check-crds crds venv clean-venv browser

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

## Bring up a local control plane with the operator, apply the examples and show them.
demo: $(STAMP)
	$(BIN)/helmhive demo

## Everything CI checks: generated CRDs, lint, types, import layering, then the whole test suite.
## Two workers (pytest-xdist), one test file each at a time: most tests wait on a real API server,
## an operator or an agent, so two of them share the machine's 2 cores well. Each worker starts
## its own control plane. The 25 slowest tests are listed at the end.
## The e2e tier on kind runs beside them: its parts are built (or reused) first, with progress on
## the terminal; then its pytest process runs in the background, its output kept in $(E2E_LOG)
## and printed when the main suite ends. Either failing fails the target.
E2E_LOG ?= $(CURDIR)/.e2e.log
test: $(STAMP) lint browser
	$(BIN)/helmhive dev kind build
	@echo "e2e tier: running beside the main suite; its output goes to $(E2E_LOG) and is printed at the end"
	@( $(E2E_PYTEST) > $(E2E_LOG) 2>&1; echo $$? > $(E2E_LOG).rc ) & \
	main=0; $(BIN)/python -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_EXTRA) \
		--ignore=tests/e2e || main=$$?; \
	wait; echo "===== the e2e tier's output ($(E2E_LOG)) ====="; cat $(E2E_LOG); e2e=$$(cat $(E2E_LOG).rc 2>/dev/null || echo 1); \
	echo "main suite: exit $$main; e2e tier: exit $$e2e"; test $$main -eq 0 && test $$e2e -eq 0

## The e2e tier alone: Helmhive installed with Helm on a two-node kind cluster (tests/e2e). First the
## node image, kind, kube-router and Helmhive's images are built or reused, with progress on the
## terminal (cold: minutes of Go builds; warm: seconds); then one pytest process makes the cluster
## through pytest-kind and runs the tier against it.
E2E_PYTEST = $(BIN)/python -m pytest -p no:cacheprovider --durations=10 $(E2E_EXTRA) tests/e2e
e2e: $(STAMP)
	$(BIN)/helmhive dev kind build
	$(E2E_PYTEST)

## Debian's chromium, which the console's browser tests drive (tests/operator/test_console_browser.py):
## Playwright cannot download a browser here. Installed from Debian only when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { echo "installing Debian's chromium for the console's browser tests ..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

lint: $(STAMP)
	$(BIN)/helmhive crds check
	$(BIN)/ruff check operator runner tests benchmarks
	$(BIN)/ruff format --check operator runner tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -P tests/harness/lint_imports.py --no-cache  # -P: tests/harness/operator.py must not shadow the stdlib

crds: $(STAMP)
	$(BIN)/helmhive crds generate

clean-venv:
	rm -rf $(VENV)
