# The workbook's entry points. On a fresh machine: `make lab` or `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8888

.PHONY: help venv kernel lab workbook handout doctor warm test data slurm-up slurm-down hub hub-down clean

help:
	@echo "make lab       set up the venv, register the kernel, start JupyterLab on 127.0.0.1"
	@echo "make test      set up the venv, then every test (unit, notebooks, Slurm when root)"
	@echo "make workbook  execute every notebook headless into build/notebooks"
	@echo "make handout   make workbook, then the executed notebooks as HTML in build/handout (+ .tar.gz)"
	@echo "make doctor    the workshop pre-flight check of this machine (python -m tutorial_lib doctor)"
	@echo "make warm      compile the workbook's compiled configurations into the shared compile cache (GPU node)"
	@echo "make data      stage cifar10, cifar100, mnist (needs internet: a login node) and imagefolder"
	@echo "make slurm-up / slurm-down   the local test cluster (root)"
	@echo "make hub / hub-down          a JupyterHub whose servers are Slurm jobs on it, learners alice and bob (root)"

venv: $(STAMP)

# Rebuilt when the lock or the package metadata changes.
$(STAMP): requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || \
		{ echo "error: $(PYTHON) is older than 3.10; run 'make PYTHON=python3.11 ...'"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@touch $@

kernel: venv
	@# ipykernel's spec, started through tutorial_lib.kernel: it sets TENSORBOARD_PROXY_URL from the hub user's prefix
	$(BIN)/python -m tutorial_lib.kernel install

lab: venv kernel
	@echo "Starting JupyterLab on 127.0.0.1:$(PORT); open the URL with the token printed below."
	@echo "On a cluster: ssh -L $(PORT):127.0.0.1:$(PORT) <login-node>, then open it locally."
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/jupyter lab --ip=127.0.0.1 --port=$(PORT) --no-browser \
		--ServerApp.root_dir=$(CURDIR) $(if $(filter 0,$(shell id -u)),--allow-root)

workbook: venv
	$(BIN)/python scripts/run_notebooks.py --out build/notebooks --timings build/notebook_timings.json \
		notebooks/*.ipynb

# The executed copies as HTML (solutions stay collapsed), to hand out after the workshop.
handout: workbook
	$(BIN)/jupyter nbconvert --to html --output-dir build/handout build/notebooks/*.ipynb
	tar -czf build/handout.tar.gz -C build handout
	@echo "handout: build/handout/*.html and build/handout.tar.gz"

doctor: venv
	$(BIN)/python -m tutorial_lib doctor

# The workshop's shared compile cache, filled ahead of the day on a node of the hub's GPU type (docs/instructor.md):
# into $$WORKBOOK_COMPILE_CACHE, else the site profile's compile_cache, else /opt/hpc-workbook/compile-cache.
# WARM_ARGS passes options, e.g. make warm WARM_ARGS="--cache /shared/compile-cache --only optimized".
warm: venv
	$(BIN)/python -m tutorial_lib warm $(WARM_ARGS)

# Slurm tests need the local cluster, which needs root; otherwise they are skipped with the reason.
# The browser test needs Debian's chromium + chromium-driver: installed here as root, else it is skipped.
# The hub test needs what `make hub` prepares (configurable-http-proxy from npm, the learners' shared
# environment, their accounts and clones): prepared here as root; the test starts and stops its own hub.
# The hub's preparation (npm, accounts, clones) runs beside the browser's (apt): neither needs the other, and on
# a fresh machine both mostly wait for downloads. Its words follow once both are done.
test: venv
	@if [ "$$(id -u)" = 0 ]; then bash scripts/slurm/local-cluster.sh up; \
	else echo "not root: the local Slurm cluster is not started and the Slurm tests will be skipped"; fi
	@hub=; if [ "$$(id -u)" = 0 ]; then mkdir -p build; bash scripts/hub/hub.sh prepare >build/hub-prepare.log 2>&1 & \
	hub=$$!; fi; bash scripts/install-browser.sh; browser=$$?; \
	if [ -n "$$hub" ]; then prepared=0; wait "$$hub" || prepared=$$?; cat build/hub-prepare.log; \
	[ "$$prepared" = 0 ] || echo "hub: not prepared (above): the hub test will fail"; fi; exit "$$browser"
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest --nbval-lax --nbval-current-env --durations=40 tests notebooks

data: venv
	$(BIN)/python -m tutorial_lib data fetch cifar10 cifar100 mnist imagefolder

slurm-up:
	bash scripts/slurm/local-cluster.sh up

slurm-down:
	bash scripts/slurm/local-cluster.sh down

# JupyterHub on the local cluster (root): prints its address, the learners' accounts and the hand-out link.
hub: venv
	bash scripts/hub/hub.sh up

hub-down:
	bash scripts/hub/hub.sh down

clean:
	rm -rf build runs .pytest_cache
