# scalectl: two commands on a fresh machine: `make test` and `make run`.
# The virtual environment is created and filled on first use, and reused after
# (the stamp file changes only when pyproject.toml or constraints.txt do).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
RECIPE ?= recipes/scalerl.toml
ARGS   ?=

.PHONY: install test test-slow run bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# constraints.txt pins the CPU build of torch (an unpinned resolution pulls CUDA)
	PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

run: $(STAMP)
	$(VENV)/bin/scalectl run $(RECIPE) $(ARGS)

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache build src/*.egg-info
