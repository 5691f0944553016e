# Two commands on a fresh machine with only python3: `make train` and `make test`.
# Both create (or reuse) the virtualenv in .venv and install the package with the pinned constraints:
# `make train` what training needs (the package with its cli extra), `make test` the test extra too (its tools, faiss,
# the text, Lightning and streaming extras).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
RUN_DIR ?= runs/default

.PHONY: install train test test-unit test-distributed lint bench gpu-check wheel-check constraints clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet --constraint constraints.txt --editable ".[cli]"
	@touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --constraint constraints.txt --editable ".[test]"
	@# mosaicml-streaming declares transformers<5 and numpy<2.2; beside the pinned set it runs unchanged with the
	@# packages it imports (the streaming-runtime extra, in .[test]), so it is installed without its declared ones.
	$(PY) -m pip install --quiet --no-deps --constraint constraints.txt mosaicml-streaming
	@touch $(TEST_STAMP)

# One intra-op thread, as benchmarks/quality.py measures: on a small shared CPU two threads per process
# slow every step down whenever the other core is busy. Override with `make train OMP_NUM_THREADS=2`.
OMP_NUM_THREADS ?= 1
train: $(STAMP)
	OMP_NUM_THREADS=$(OMP_NUM_THREADS) $(PY) -m composer_dynsample train yamls/mnist1d_default.yaml --run-dir $(RUN_DIR) --overwrite

test: $(TEST_STAMP) lint test-unit test-distributed

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check composer_dynsample tests benchmarks
	$(VENV)/bin/ruff format --check composer_dynsample tests benchmarks
	$(PY) benchmarks/report.py --check  # the README's benchmark summary matches benchmarks/results

# The unit tests run in TEST_WORKERS processes (pytest-xdist; most of their time is single-threaded Python and
# the processes they start), and the 25 slowest are listed at the end: the suite is kept under 15 minutes with
# the install on 2 cores. `make test TEST_WORKERS=1` runs them in one process.
TEST_WORKERS ?= 2
test-unit: $(TEST_STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --durations=25 --doctest-modules composer_dynsample tests

test-distributed: $(TEST_STAMP)
	PYTHON=$(PY) bash tests/run_distributed.sh 2

# The wheel of this checkout in a fresh virtualenv with only its base dependencies (torch, mosaicml,
# torchmetrics, numpy): docs/examples/own_composer_model.py on 1 process and under `composer -n 2`.
wheel-check:
	PYTHON=$(PYTHON) bash .ci/wheel_check.sh

bench: $(TEST_STAMP)
	$(PY) benchmarks/samplers.py
	$(PY) benchmarks/miners.py
	$(PY) benchmarks/miner_objects.py
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/antipattern.py
	$(PY) benchmarks/dataloader.py
	$(PY) benchmarks/miners_scaling.py
	$(PY) benchmarks/distributed.py
	$(PY) benchmarks/threads.py --epochs 1
	$(PY) benchmarks/table.py
	$(PY) benchmarks/chunking.py
	$(PY) benchmarks/quality.py
	$(PY) benchmarks/quality_glyphs.py --group sampling_glyphs
	$(PY) benchmarks/quality_glyphs.py --group contrastive_glyphs
	$(PY) benchmarks/text_loader.py
	$(PY) benchmarks/streaming.py
	$(PY) benchmarks/quality_code.py
	$(PY) benchmarks/quality_mined.py --jobs 2
	$(PY) benchmarks/table_costs.py
	$(PY) benchmarks/report.py

# On a CUDA machine, in <= 5 minutes (every check has a share of it; one past its share is stopped and
# recorded as timed_out): the miners on the GPU against the CPU, AMP training through the CLI, pin_memory,
# the transformer encoder's step rate, (2+ GPUs) a cross-rank NCCL step and the corpus search of mined
# negatives; results in benchmarks/results/gpu.*. Without CUDA it lists what it skipped and why, writes
# gpu_cpu_only.* and exits 0. `python benchmarks/gpu.py --device cpu` dry-runs it on any machine.
gpu-check: $(TEST_STAMP)
	$(PY) benchmarks/gpu.py

# Refresh the pins on purpose: install the newest allowed versions in a scratch venv, test, then freeze.
constraints:
	rm -rf .venv-refresh && $(PYTHON) -m venv .venv-refresh
	.venv-refresh/bin/python -m pip install --quiet --upgrade pip && .venv-refresh/bin/python -m pip install --quiet --editable ".[test]"
	.venv-refresh/bin/python -m pip freeze --exclude-editable | grep -v '^composer-dynsample' > constraints.txt
	rm -rf .venv-refresh

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
