# parabench: every target installs what it needs, so a fresh machine runs `make bench`
# or `make test` and nothing else.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PB     := $(VENV)/bin/parabench
# Data: $PARABENCH_DATA_ROOT, else ../shared/data where it exists, else ./data (MNIST is
# downloaded there on first use when the machine has internet).
DATA_ROOT ?= $(or $(PARABENCH_DATA_ROOT),$(wildcard ../shared/data),data)
# Three repeats, interleaved round by round: the fewest that give every figure a 95 %
# interval (bench/harness/stats.py); BENCH_ARGS may override.
BENCH_ARGS ?=
export PARABENCH_TEST_DATA ?= $(abspath $(DATA_ROOT))

.PHONY: install horovod bench test test-fast test-torch lint format report verify overhead microbench gpu-check clean help
help:
	@echo "make install    the virtual environment ($(VENV)) with parabench and its dev tools"
	@echo "make bench      install, then run every available strategy on MNIST (results/<run-id>/)"
	@echo "make test       install (Horovod included), then the test suite"
	@echo "make test-fast  install, then the tests not marked slow"
	@echo "make verify     parity of every strategy with the single-device baseline"
	@echo "make report     re-render the report of the newest run (by its runs.csv's time)"
	@echo "make overhead   harness vs a hand-written loop: paired rounds, median ratio and its 95 % interval"
	@echo "make microbench all_reduce, all_gather, reduce_scatter latency / bus bandwidth (pytest-benchmark)"
	@echo "make horovod    build Horovod 0.28.1 against the installed torch (cached)"
	@echo "make gpu-check  on a CUDA machine, offline: GPU tests and a reference run (results/reference/)"
	@echo "make test-torch TORCH=2.10.0  the fast suite against another torch (PYTEST_ARGS: other tests)"
	@echo "make lint       ruff"
	@echo "make format     ruff format"
	@echo "make clean      remove $(VENV), test-torch's .venv-torch-*, the caches and build outputs"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel

$(VENV)/.installed: $(PY) pyproject.toml constraints.txt
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $@

install: $(VENV)/.installed

# Builds Horovod from its PyPI sdist against this torch, once; later calls reuse the
# cached wheel. A failed build leaves the horovod strategies listed as unavailable.
horovod: install
	scripts/build_horovod.sh $(PY)

bench: install
	-@$(MAKE) --no-print-directory horovod
	$(PB) run --dataset mnist --data-root $(DATA_ROOT) --download --repeats 3 $(BENCH_ARGS)

# PARABENCH_REQUIRE_HOROVOD: a Horovod that failed to build fails the Horovod tests
# instead of skipping them. The suite in two parts: on TEST_WORKERS pytest-xdist workers
# (tests sharing a run on one: tests/suite_parts.py), then the tests marked serial alone
# (they time something or wait on a fixed deadline). Both run, and either's failure fails
# it; a Ctrl-C in the first (pytest's exit 2) ends it there.
TEST_WORKERS ?= 2
SUITE := PARABENCH_REQUIRE_HOROVOD=1 $(PY) -m pytest -q -ra tests benchmarks/test_collectives.py --benchmark-disable
test: install horovod
	-@scripts/slurm_cluster.sh install || echo "slurm-wlm not installed: the SLURM tests will skip"
	@rc=0; \
	( set -x; $(SUITE) --durations=30 -n $(TEST_WORKERS) --dist loadgroup -m "not serial" ) || rc=$$?; \
	[ $$rc -ne 2 ] || exit 2; \
	( set -x; $(SUITE) --durations=10 -m serial ) || rc=$$?; \
	exit $$rc

test-fast: install
	$(PY) -m pytest -q -ra -m "not slow"

# The suite against another torch than constraints.txt's, in its own .venv-torch-$(TORCH):
# the default is the oldest it has passed on (pyproject.toml's bound; README, "Which torch").
TORCH ?= 2.10.0
PYTEST_ARGS ?=
test-torch:
	PYTHON=$(PYTHON) scripts/test_torch.sh $(TORCH) $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check bench strategies tests benchmarks
	$(VENV)/bin/ruff format --check bench strategies tests benchmarks

format: install
	$(VENV)/bin/ruff format bench strategies tests benchmarks

# the newest run by when its runs.csv was written; none yet: one line, exit 2
report:
	$(if $(wildcard results/*/runs.csv),,$(error no run under results/ yet: make bench first))
	@$(MAKE) --no-print-directory install
	$(PB) report "$$(dirname "$$(ls -t results/*/runs.csv | head -1)")"

verify: install
	-@$(MAKE) --no-print-directory horovod
	$(PB) verify --data-root $(DATA_ROOT) --download

overhead: install
	$(PY) benchmarks/overhead.py --data-root $(DATA_ROOT) --download

# pytest-benchmark keeps every run under results/microbench and compares with the last;
# MICROBENCH_ARGS=--benchmark-compare-fail=median:25% turns a regression into a failure.
MICROBENCH_ARGS ?=
microbench: install
	$(PY) -m pytest benchmarks -q -p no:cacheprovider --benchmark-storage=results/microbench \
		--benchmark-autosave --benchmark-compare --benchmark-columns=min,median,iqr,max,rounds \
		--benchmark-sort=name $(MICROBENCH_ARGS)

# On a machine with a CUDA GPU and no network: uses that machine's Python and torch, fetches
# nothing; GPU_CHECK_PARTS picks parts (install tests mnist resnet50 resnet50-all compile
# overhead horovod apex; minutes each on one H100: scripts/gpu_check.sh); GPU_CHECK_DRY_RUN=1
# plans them on a CPU.
GPU_CHECK_PARTS ?=
gpu-check:
	PYTHON=$(PYTHON) scripts/gpu_check.sh $(GPU_CHECK_PARTS)

# what the targets above make and git ignores: test-torch's venvs too (one per torch
# version, each as large as $(VENV)); not results/, nor the data or wheels carried for a GPU
clean:
	rm -rf $(VENV) .venv-torch-* .pytest_cache .ruff_cache build *.egg-info */__pycache__ \
		*/*/__pycache__
