# forkd: the two promised commands are `make demo` and `make test`; each does all set-up first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: setup deps venv clients node-deps image demo test test-unit test-integration stress bench bench-capacity lint clean help

help:
	@echo "make demo   - set up everything, then fork and branch sandboxes (the main job)"
	@echo "make test   - set up everything, then run the whole test suite (real QEMU VMs)"
	@echo "make bench  - set up everything, run the benchmarks in bench/, regenerate docs/PERFORMANCE.md"
	@echo "make bench-capacity - opt-in: how many idle children this host holds (up to 1000), and HIBERNATE_N (1000) hibernated ones"
	@echo "make stress - opt-in: branch and restore many times under CPU load, and the floods and soaks in full"
	@echo "make lint   - ruff, mypy (strict), the layer contract (lint-imports), the Python SDK's generated folder (sync twins, models: current, nothing else there), the TypeScript SDK (types and option mapping from the OpenAPI, tsc, every request field sendable)"

setup: deps venv clients node-deps image

# The TypeScript SDK's, the browser test's, the E2B JS clients' and the console's (xterm.js) npm
# packages, exactly as locked.
NODE_DIRS := sdk/typescript tests/browser tests/clients/e2b-js src/forkd/api/ui_vendor
node-deps: deps $(addsuffix /node_modules/.installed,$(NODE_DIRS))

%/node_modules/.installed: %/package-lock.json %/package.json
	cd $* && npm ci --no-audit --no-fund --loglevel=error
	touch $@

deps:
	bash scripts/install-deps.sh

venv: $(BIN)/.installed

# Every extra (daemon, e2b, fleet, mcp) plus dev and bench, at the exact versions of constraints.txt
# (pyproject.toml keeps ranges: `pip install forkd` is the SDK and CLI alone).
$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[all,dev,bench]'
	touch $@

# The published clients the compatibility tests drive (forkd 0.5.3, forkd-mcp 0.2.1, the E2B
# SDKs), pinned in tests/clients/requirements.txt, in a virtualenv of their own.
clients:
	PYTHON=$(PYTHON) bash scripts/clients-venv.sh

# Cached under the data dir, keyed by its recipe: instant when nothing changed.
image: venv
	$(BIN)/forkd image build

demo: setup
	$(BIN)/python examples/demo.py

# Unit tests on every core (pytest-xdist), then the VM tests on VM_WORKERS workers, a module at a
# time each (--dist loadfile): a module's daemon and the session's templates are shared within a
# worker. Most of a VM test's time is spent waiting on guests and clients rather than on a core,
# so two workers finish the VM tests in about 60% of the time of one, even on 2 cores; and every
# test runs beside another forkd, as it must (a test may not count on being the host's only one).
VM_WORKERS ?= 2
test: setup
	$(BIN)/pytest -ra -n auto tests/unit $(PYTEST_ARGS)
	$(BIN)/pytest -ra -n $(VM_WORKERS) --dist loadfile tests/integration $(PYTEST_ARGS)

test-unit: venv node-deps
	$(BIN)/pytest -ra -n auto tests/unit $(PYTEST_ARGS)

test-integration: setup
	$(BIN)/pytest -ra -n $(VM_WORKERS) --dist loadfile tests/integration $(PYTEST_ARGS)

# Opt-in: branch and restore many times under CPU load, then the floods and soaks (marker "soak") in
# their full form: a minute of console flood, 20 s on the agent port, 200 networked children, 100 MiB
# transfers (make test runs each in a short form with the same checks). Tens of minutes.
stress: setup
	$(BIN)/pytest -ra -s -m stress tests/stress $(PYTEST_ARGS)
	FORKD_FULL_SOAKS=1 $(BIN)/pytest -ra -s -m soak tests/integration $(PYTEST_ARGS)

# Every benchmark, then docs/PERFORMANCE.md regenerated (< 17 min on 2 cores; see bench/run_all.py).
bench: setup
	bash scripts/install-deps.sh --bench
	$(BIN)/python bench/run_all.py

# Opt-in: how many idle children this host holds at once (up to 1000; ~12 min, bounded), then
# HIBERNATE_N sandboxes held with all but 100 hibernated (1000: about 20 min; 10000: hours).
HIBERNATE_N ?= 1000
bench-capacity: setup
	$(BIN)/python bench/run_all.py --capacity --hibernate-n $(HIBERNATE_N)

lint: venv node-deps
	$(BIN)/ruff check src tests bench examples scripts
	$(BIN)/ruff check --select SLF001 src
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python scripts/unasync_sdk.py --check
	$(BIN)/python scripts/gen_sdk_models.py --check
	$(BIN)/python scripts/gen_ts_types.py --check
	$(BIN)/kubernetes-validate --strict --quiet $(filter-out %/kustomization.yaml,$(wildcard deploy/k8s/*.yaml))
	cd sdk/typescript && npm run --silent build && npm run --silent build:test && npm run --silent test:offline

clean:
	rm -rf $(VENV) .venv-clients .pytest_cache .ruff_cache $(addsuffix /node_modules,$(NODE_DIRS)) sdk/typescript/dist sdk/typescript/build
