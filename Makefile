# rlcollect: every target installs what it needs into .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

BENCH_VENV ?= .venv-bench
# LeRobot's own dataset reader, for tests/ops/test_export_lerobot.py: lerobot 0.4.4 (the
# last release for Python 3.11) --no-deps, with only what its dataset reader imports, on
# the CPU torch 2.13 (its pins, torch<2.11 and torchvision<0.26, mean CUDA wheels of GBs;
# torchvision cannot load into CPU torch: the test's reader script stands in for it;
# pip then lists the pins of lerobot it leaves unmet: expected)
LEROBOT_VENV ?= .venv-lerobot
LEROBOT_STAMP := $(LEROBOT_VENV)/.installed

.PHONY: help install run test lint format bench bench-compare clean lerobot-reader

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

$(LEROBOT_STAMP):
	rm -rf $(LEROBOT_VENV)
	$(PYTHON) -m venv $(LEROBOT_VENV)
	$(LEROBOT_VENV)/bin/pip install --quiet "torch==2.13.0"
	$(LEROBOT_VENV)/bin/pip install --quiet --no-deps "lerobot==0.4.4"
	$(LEROBOT_VENV)/bin/pip install --quiet "datasets>=4,<5" "huggingface-hub>=0.34.2,<0.36" \
		"av>=15,<16" "accelerate>=1.10,<2" "packaging>=24.2,<26" "pillow>=10"
	touch $(LEROBOT_STAMP)

lerobot-reader: $(LEROBOT_STAMP)  ## the venv the LeRobot export's tests load it with

test: $(STAMP) $(LEROBOT_STAMP)  ## run the test suite
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
	rm -rf $(VENV) $(BENCH_VENV) $(LEROBOT_VENV) build dist *.egg-info .pytest_cache .ruff_cache
