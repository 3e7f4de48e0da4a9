# rlcollect: every target installs what it needs into .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

BENCH_VENV ?= .venv-bench

.PHONY: help install run test lint format bench bench-compare clean

help:  ## list the targets
	@grep -E '^[a-z]+:.*## ' Makefile | sed 's/:.*## /\t/' | sort

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# the CPU build of torch first, so that the range in pyproject.toml installs nothing bigger
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)  ## create .venv with rlcollect and its dev tools

run: $(STAMP)  ## the headline job: 1e6 Pendulum frames into data/ (CPU)
	$(BIN)/rlcollect run env=Pendulum total_frames=1e6 device=cpu overwrite=true

test: $(STAMP)  ## run the test suite
	$(BIN)/pytest -q -n 2

lint: $(STAMP)  ## ruff lint + format check
	$(BIN)/ruff check collect_cli tests benchmarks
	$(BIN)/ruff format --check collect_cli tests benchmarks

format: $(STAMP)  ## apply ruff fixes and formatting
	$(BIN)/ruff check --fix collect_cli tests benchmarks
	$(BIN)/ruff format collect_cli tests benchmarks

bench: $(STAMP)  ## throughput benchmarks; appends dated records to benchmarks/records/
	$(BIN)/python benchmarks/bench.py
	$(BIN)/python benchmarks/memory.py

bench-compare:  ## bench.py beside TorchRL and Minari (in .venv-bench: TorchRL pins its tensordict)
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet "torch==2.13.0"
	$(BENCH_VENV)/bin/pip install --quiet -e ".[bench]"
	$(BENCH_VENV)/bin/python benchmarks/bench.py

clean:  ## remove the venvs and build artefacts
	rm -rf $(VENV) $(BENCH_VENV) build dist *.egg-info .pytest_cache .ruff_cache
