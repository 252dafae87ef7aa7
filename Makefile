# Two entry points on a fresh machine: `make demo` (main job on the embedded default) and
# `make test` (the suite). Both create .venv and install the package first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# GPU machines take torch from pyproject's open range; CPU-only machines get the CPU build first.
TORCH_CPU ?= torch==2.13.*

.PHONY: install demo test test-fast test-floor lint bench recipe recipe-bm25 recipe-mined recipe-mined-base recipe-ema clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then \
		echo "no GPU found: installing the CPU build of torch ($(TORCH_CPU))"; \
		$(BIN)/pip install -q "$(TORCH_CPU)"; \
	fi
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: install
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/acare demo

test: install
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/pytest -q

# The inner loop: no Ray, no servers, no subprocesses, nothing marked slow (tests/conftest.py
# marks the heavy modules). Not instead of `make test`, which CI runs.
test-fast: install
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/pytest -q -m "not heavy and not slow"

# The suite against the oldest versions pyproject allows (requirements/floor.txt), in its own
# venv. CI keeps the current versions (make test).
FLOOR_VENV ?= .venv-floor
test-floor:
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/pip install -q --upgrade pip
	$(FLOOR_VENV)/bin/pip install -q -c requirements/floor.txt -e ".[test]" ruff
	RAY_USAGE_STATS_ENABLED=0 $(FLOOR_VENV)/bin/pytest -q

lint: install
	$(BIN)/ruff check acare_ray tests benchmarks
	$(BIN)/ruff format --check acare_ray tests benchmarks

bench: install
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/python -m benchmarks.bench_scorer

# The published recipe: `acare adopt` with the committed config for our data, every stage (the
# traces' split, MuSiQue + HotpotQA as extra training data, the untrained control, hard negatives
# from a second retriever, the full pass with early stopping, the safe fusion fit, the test,
# cost, the agent loop and the decision report under runs/adopt-dense/seed$(SEED)/).
SEED ?= 0
recipe: install
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/acare adopt --config adopt_configs/r1-searcher-hotpotqa-dense.yaml --seed $(SEED)

# The recipe before it: the same full pass with BM25's hard negatives (runs/adopt/seed$(SEED)/).
recipe-bm25: install
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/acare adopt --config adopt_configs/r1-searcher-hotpotqa.yaml --seed $(SEED) --stages data,baseline,train,fit,test,cost,loop,report

# The BM25-negatives recipe with a moving average of the weights validated and saved (ema_decay
# 0.98); the zero-training control is that recipe's.
recipe-ema: install
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/acare adopt --config adopt_configs/r1-searcher-hotpotqa-ema.yaml --seed $(SEED) --stages data,train,fit,test,cost,loop,report

# One round of self-mined hard negatives on top of `make recipe-bm25` for the same seed (run that first).
recipe-mined: install
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/acare adopt --config adopt_configs/r1-searcher-hotpotqa-mined.yaml --seed $(SEED) --stages data,mine,train,fit,test,cost,loop,report

# The recipe's full pass from the base model with hard negatives mined by the EMA recipe's seed
# (its top one skipped) instead of BM25's (`make recipe-ema` first).
recipe-mined-base: install
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/acare adopt --config adopt_configs/r1-searcher-hotpotqa-mined-base.yaml --seed $(SEED) --stages data,mine,train,fit,test,cost,loop,report

clean:
	rm -rf $(VENV) $(FLOOR_VENV) .pytest_cache
