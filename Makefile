# Two commands: `make demo` and `make test`. Both create .venv if missing and install the
# project into it. Torch is installed first from an exact pin (CPU build here, via pip's
# find-links) and then held by a constraints file, so no later step can swap in a CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= cpu,dev
# Test processes (pytest-xdist). A job-level test keeps about one core of two busy (it waits on
# Ray's starts and its own processes), so two share a 2-core machine well. Each test process
# starts a local Ray of its own: raise it with the cores and memory. Tests are handed out one at
# a time (--maxschedchunk 1), the whole-job tests first (tests/conftest.py): longest first, so
# neither process ends the run alone on a three-minute test while the other has none left.
TEST_WORKERS ?= 2
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# Keep whatever torch the venv (or a --system-site-packages venv) already has.
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --no-compile "$(TORCH_SPEC)"
	@$(PY) -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/torch-constraint.txt
	PIP_CONSTRAINT=$(VENV)/torch-constraint.txt $(PY) -m pip install -q --no-compile -e ".[$(EXTRAS)]"
	@# pip byte-compiles the ~21,600 modules it installs one at a time; compiled here instead, on
	@# every core: 68-76 s for the whole install against 89-101 s on 2 cores. They must be compiled
	@# somewhere: under PYTHONDONTWRITEBYTECODE=1 (set on CI's machine) no process writes them, and
	@# every process would compile what it imports. The status is not checked: torch ships files
	@# only Python 3.12 parses, which pip's own compile skips too.
	@$(PY) -m compileall -q -q -j 0 $(VENV)/lib || true
	@touch $(STAMP)

demo: $(STAMP)
	RAY_AUTH_MODE=disabled $(PY) jobs/train.py --config jobs/configs/demo.yaml

test: $(STAMP)
	RAY_AUTH_MODE=disabled $(PY) -m pytest -q -n $(TEST_WORKERS) --dist load --maxschedchunk 1 --durations=25 tests

test-fast: $(STAMP)
	RAY_AUTH_MODE=disabled $(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow" tests

lint: $(STAMP)
	$(PY) -m ruff check pipeline jobs tests bench
	$(PY) -m ruff format --check pipeline jobs tests bench
	$(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf runs mlruns.db mlartifacts
