# monarch-kernel. Every target sets up what it needs from nothing (venv, Python and
# Rust dependencies, the maturin build); run `make help` for the list.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMPS := $(VENV)/.stamps
NATIVE_SRC := $(shell find native/src proto -type f) native/Cargo.toml native/build.rs Cargo.toml
export CARGO_TERM_COLOR ?= never

.DEFAULT_GOAL := help
.PHONY: help setup demo demo-multihost test test-rust test-unit test-fast test-python test-extension bench lint fmt stubs clean

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# The wheel's data folder (pyproject's [tool.maturin] data): its data/ lands in the
# environment's prefix: the server extension's config (tracked) and the Meshes panel
# (built into it once JupyterLab is installed).
WHEEL_DATA := wheel-data

# The dependencies only, read from pyproject.toml: installing the package itself
# (pip install -e) would build the Rust core, and maturin develop builds it again
# below. The core is built once, by maturin develop, which installs the package.
$(STAMPS)/deps: pyproject.toml | $(PY)
	@mkdir -p $(STAMPS)
	$(PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	  print("\n".join(p["dependencies"] + p["optional-dependencies"]["dev"]))' > $(VENV)/requirements.txt
	$(PIP) install -q -r $(VENV)/requirements.txt
	@touch $@

# After the panel: maturin develop installs it from the wheel's data into the venv.
$(STAMPS)/native: $(NATIVE_SRC) $(STAMPS)/labext | $(STAMPS)/deps
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release -q
	@touch $@

$(STAMPS)/kernelspec: monarch_kernel/kernel/_install.py | $(STAMPS)/native
	$(PY) -m monarch_kernel install --sys-prefix
	@touch $@

# The Meshes panel (extension/): built with npm (Debian's node where there is none)
# into the wheel's data (package.json's jupyterlab.outputDir), so the package carries
# it as a prebuilt extension (install.json: installed by pip) and every install of
# the package, maturin develop's included, puts it in share/jupyter/labextensions.
LABEXT := $(WHEEL_DATA)/data/share/jupyter/labextensions/monarch-kernel-panel
$(STAMPS)/labext: extension/package.json extension/tsconfig.json extension/install.json $(wildcard extension/src/*.ts extension/style/*.css) | $(STAMPS)/deps
	@command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq nodejs npm; }
	cd extension && npm install --no-audit --no-fund --loglevel=error && npx tsc
	cd extension && node node_modules/@jupyterlab/builder/lib/build-labextension.js \
	  --core-path "$$($(abspath $(PY)) -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')" .
	cp extension/install.json $(LABEXT)/install.json  # (the builder empties its output first)
	@touch $@

setup: $(STAMPS)/native $(STAMPS)/kernelspec $(STAMPS)/labext ## Create the venv, install dependencies (torch included), build the native core, install the kernelspec and the Meshes panel

demo: setup ## Set up, then execute notebooks/quickstart.ipynb through the monarch kernel and print it
	$(PY) -m demo.run_notebook notebooks/quickstart.ipynb

demo-multihost: setup $(STAMPS)/cluster ## Bring up the test cluster, run notebooks/multihost.ipynb on it through SLURM, tear it down
	$(PY) -m demo.run_multihost

# Browser tests drive Debian's chromium (Playwright's own browser download is not used).
$(STAMPS)/browser: | $(STAMPS)/deps
	@command -v chromium >/dev/null || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }
	@touch $@

test: setup $(STAMPS)/browser $(STAMPS)/cluster k8s-bed test-rust test-extension test-python ## Set up, then run every test (Rust, the panel's TypeScript and Python; browser tests in Debian's chromium)

test-rust: ## cargo test of the native core (no Python needed)
	cargo test -q --manifest-path native/Cargo.toml

test-extension: ## jest tests of the Meshes panel's rendering, extension/src/__tests__ (no venv needed)
	@command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq nodejs npm; }
	cd extension && npm install --no-audit --no-fund --loglevel=error && npm test

test-unit: $(STAMPS)/native ## The unit tests only (no workers, hosts or browser): under a minute
	$(PY) -m pytest -q tests/unit

test-fast: setup ## Every test but the slow, browser and multi-host ones (their markers)
	$(PY) -m pytest -q -m "not slow and not browser and not multihost"

test-python: setup $(STAMPS)/browser $(STAMPS)/cluster k8s-bed ## pytest: unit and integration tests against real agents and workers
	$(PY) -m pytest -q

bench: setup $(if $(AB),,$(STAMPS)/cluster k8s-bed) ## Print this project's figures beside baselines measured in the same run, the test cluster's and the k8s bed's included (AB=COMMIT: the call rows of this checkout and of COMMIT's build, run alternately)
	$(if $(AB),$(PY) -m bench.ab $(AB),$(PY) -m bench.run)

lint: setup ## ruff, mypy, stubtest of _native.pyi, cargo fmt and clippy; eslint and prettier on the panel (extension/)
	$(VENV)/bin/ruff check monarch_kernel tests bench demo tools
	$(VENV)/bin/ruff format --check monarch_kernel tests bench demo tools
	$(VENV)/bin/mypy monarch_kernel tools
	$(PY) -m mypy.stubtest monarch_kernel._native --allowlist .ci/stubtest-allowlist.txt
	cargo fmt --manifest-path native/Cargo.toml --check
	cargo clippy -q --manifest-path native/Cargo.toml --all-targets -- -D warnings
	cargo clippy -q --manifest-path native/Cargo.toml --features python -- -D warnings
	cd extension && npm install --no-audit --no-fund --loglevel=error && npm run lint

fmt: setup ## Format Python, Rust and the panel's TypeScript (prettier; eslint --fix)
	$(VENV)/bin/ruff format monarch_kernel tests bench demo tools
	$(VENV)/bin/ruff check --fix monarch_kernel tests bench demo tools
	cargo fmt --manifest-path native/Cargo.toml
	cd extension && npm install --no-audit --no-fund --loglevel=error && npm run fmt

stubs: setup ## Regenerate the checked-in grpcio stubs from proto/
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --grpc_python_out=. --pyi_out=. proto/monarch_kernel/v1/agent.proto

clean: ## Remove the venv and build outputs
	rm -rf $(VENV) target build $(WHEEL_DATA)/data/share

# Multi-host tests (tests/multihost, docs/testing-multihost.md) on the test cluster
# (tools/testcluster): hosts in network namespaces with sshd and SLURM. Services of the
# packages installed here are stopped and disabled: the tests run their own daemons,
# inside the namespaces only.
.PHONY: cluster-up cluster-down k8s-bed
$(STAMPS)/cluster: | $(STAMPS)/deps
	@export PATH="$$PATH:/usr/sbin:/sbin"; \
	command -v slurmctld >/dev/null && command -v sshd >/dev/null && command -v munged >/dev/null || { \
	  echo "installing SLURM, munge and openssh-server for the multi-host tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  new=$$(for u in openssh-server:ssh slurmctld:slurmctld slurmd:slurmd munge:munge; do \
	    dpkg -s $${u%:*} >/dev/null 2>&1 || echo $${u#*:}; done); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
	    slurmctld slurmd slurm-client munge openssh-server openssh-client iproute2 >/dev/null || exit 1; \
	  for u in $$new; do $$SUDO systemctl disable --now $$u || $$SUDO service $$u stop; done >/dev/null 2>&1; true; }
	@touch $@

cluster-up: $(STAMPS)/cluster ## Bring up a test cluster: hosts in network namespaces with sshd and SLURM
	$(PY) -m tools.testcluster up

cluster-down: | $(PY) ## Remove every test cluster this machine has
	$(PY) -m tools.testcluster down --all

# The Kubernetes tests (tests/k8s) run a real control plane built from Go modules:
# about 30 minutes the first time, cached outside the repository after that
# (tools/k8s/build.sh; $$MONARCH_K8S_CACHE, default ~/.cache/monarch-kernel/k8s).
k8s-bed: ## Build the k8s test bed's binaries (kube-apiserver, etcd, ...) if they are not cached
	@tools/k8s/build.sh >/dev/null
