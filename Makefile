# One-command dev loop. Every target builds .venv itself, so each works on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# Every optional extra that works on a CPU, so no feature's tests are skipped in CI.
EXTRAS ?= dev,monitor,plot,tensorboard,trackers,hf
NPROC ?= 2
PYTEST_ARGS ?=

.PHONY: help install slurm chromium test test-quick test-matrix test-faults test-tp test-gpu lint format demo bench bench-env bench-gpu clean

help:
	@echo "make demo      train the built-in example on $(NPROC) CPU processes (torchrun, gloo)"
	@echo "make test      run the whole test suite"
	@echo "make test-quick the suite without the tests marked slow (the inner loop; CI runs all)"
	@echo "make test-matrix every strategy and world size resumed by every other (~40 min on 2 cores)"
	@echo "make test-faults every cell of the fault matrix: 4 faults x 4 runners x 4 places (~6 min)"
	@echo "make test-tp     tensor parallel x FSDP2: parity, resumes across layouts, plans, HF Llama (~8 min)"
	@echo "make lint      ruff + mypy"
	@echo "make test-gpu  the GPU tier (needs CUDA)"
	@echo "make bench     checkpoint, loops (vs Accelerate, Fabric), Trainer, memory, batch-finder, start-up, trackers"
	@echo "make bench-gpu GPT-2 124M shape on one GPU: tokens/s, MFU, memory; then the GPU tests"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel

# torch first: a plain `pip install torch` would pull a multi-GB CUDA build on a CPU machine.
# A venv that already has torch (e.g. a CUDA build you installed) keeps it; to reuse a system
# torch, create the venv yourself with `python3 -m venv --system-site-packages .venv`.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null \
		|| $(BIN)/python -m pip install -q "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	@# DeepSpeed's setup imports torch: build it against the torch above, with no CUDA ops.
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q --no-build-isolation "deepspeed>=0.19,<0.20"
	@touch $@

install: $(VENV)/.installed slurm chromium

# The real SLURM of tests/test_slurm_cluster.py (Debian's packages, no service started): a no-op
# once installed; where it cannot install (not root, no apt-get) it says so and those tests skip.
slurm:
	@sh .ci/install-slurm

# Debian's chromium, for the report page's test in a real browser (headless); like slurm.
chromium:
	@sh .ci/install-chromium

# Two passes. First the tests without a limit in seconds, on $(TEST_WORKERS) pytest-xdist workers:
# whole files each (a module's shared runs happen once), the slow files first. Then the tests
# marked `serial` (the fault matrix, the watchdog, signals, restarts) with the machine to
# themselves, as their limits assume. Both passes always run; the target fails if either does
# (exit code 5, nothing selected, is not a failure).
TEST_WORKERS ?= 2
PYTEST := OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q
define two_passes
	rc=0; \
	$(PYTEST) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "$(1)not serial" --durations=$(2) $(PYTEST_ARGS) \
		|| { code=$$?; [ $$code -eq 5 ] || rc=$$code; }; \
	$(PYTEST) -m "$(1)serial" --durations=$(2) $(PYTEST_ARGS) \
		|| { code=$$?; [ $$code -eq 5 ] || rc=$$code; }; \
	exit $$rc
endef

test: $(VENV)/.installed slurm chromium
	$(call two_passes,,20)

test-quick: $(VENV)/.installed
	$(call two_passes,not slow and ,10)

# The full resume matrix of issue 31 (tests/test_resume_matrix.py, marked `matrix`, which
# `make test` leaves out): none, DDP, FSDP2, ZeRO-1/2/3 at 1, 2 and 4 ranks (and ZeRO-2/3 with
# CPU offload on 2), each resumed by every other, and a stream resumed on 4 ranks
# (tests/test_streaming.py), the streams' CLI negative controls (tests/test_stateful_stream.py,
# tests/test_hf_stream.py), and what `make test` leaves out of its resume subsets: two of the
# three negative controls and the ZeRO preflight line (tests/test_resume_anywhere.py), the
# LoRA pairs of tests/test_resume_anywhere_hf.py, the DDP -> ZeRO loss-scale negative control
# (tests/test_resume_loss_scale.py); each cell's max |weight diff| goes to
# $(MATRIX_REPORT) as JSON lines. One pass, no xdist: the 4-rank cells fill the machine.
MATRIX_REPORT ?= runs/resume-matrix.jsonl
test-matrix: $(VENV)/.installed
	@mkdir -p $(dir $(MATRIX_REPORT)) && rm -f $(MATRIX_REPORT)
	GT_RESUME_MATRIX=$(MATRIX_REPORT) $(PYTEST) -m matrix tests/test_resume_matrix.py tests/test_streaming.py tests/test_stateful_stream.py tests/test_hf_stream.py tests/test_resume_anywhere.py tests/test_resume_anywhere_hf.py tests/test_resume_loss_scale.py --durations=15 $(PYTEST_ARGS)

# The whole fault matrix (tests/test_faults.py: 63 cells; make test runs a Latin square of 16,
# in which every fault kind meets every runner and every place).
test-faults: $(VENV)/.installed
	$(PYTEST) -m "matrix or not matrix" tests/test_faults.py --durations=15 $(PYTEST_ARGS)

# Tensor parallel x FSDP2 (tests/test_tensor_parallel.py): make test runs its parity tests, the
# negative control and one resume; this adds the rest (marked `matrix`): resumes across layouts
# and back, ckpt consolidate, the user's plans, the Hugging Face Llama and its export.
test-tp: $(VENV)/.installed
	$(PYTEST) -m "matrix or not matrix" tests/test_tensor_parallel.py --durations=15 $(PYTEST_ARGS)

ifeq ($(GPU_PYTHON),)
test-gpu: $(VENV)/.installed
	$(BIN)/python -m pytest -q -m "requires_cuda or requires_gpus" $(PYTEST_ARGS)
else
test-gpu:
	PYTHONPATH=$(CURDIR)/src $(GPU_PYTHON) -m pytest -q -m "requires_cuda or requires_gpus" $(PYTEST_ARGS)
endif

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/ruff format --check src tests examples benchmarks
	$(BIN)/mypy --no-incremental  # a stale cache once hid errors CI saw

format: $(VENV)/.installed
	$(BIN)/ruff check --fix src tests examples benchmarks
	$(BIN)/ruff format src tests examples benchmarks

demo: $(VENV)/.installed
	$(BIN)/gpu-training train configs/ddp_config.yaml --nproc $(NPROC)

# Accelerate and Lightning Fabric are what the loop benchmarks compare against, not
# dependencies: they live in their own environment, on the project's torch (pinned in the same
# install, so neither can move it).
BENCH_VENV ?= .venv-bench
$(BENCH_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install -q "torch==$(TORCH_VERSION)"
	$(BENCH_VENV)/bin/python -m pip install -q -e . "torch==$(TORCH_VERSION)" \
		"accelerate>=1.0" "lightning-fabric>=2.4"
	@touch $@

bench-env: $(BENCH_VENV)/.installed

bench: $(VENV)/.installed $(BENCH_VENV)/.installed
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_checkpoint.py
	OMP_NUM_THREADS=1 $(BENCH_VENV)/bin/python benchmarks/bench_loops.py
	OMP_NUM_THREADS=1 $(BENCH_VENV)/bin/python benchmarks/bench_trainer.py
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_memory.py
	$(BIN)/python benchmarks/bench_batch_finder.py
	$(BIN)/python benchmarks/bench_startup.py
	$(BIN)/python benchmarks/bench_trackers.py

# One prepared run for a GPU machine (< 8 min): the GPU benchmark, then the GPU tier of tests.
# On a machine whose python already has a CUDA torch and no package index to install from
# (a lent GPU box), use that python and this checkout's src/, installing nothing:
#   make bench-gpu GPU_PYTHON=python3 BENCH_GPU_ARGS="--json $$OUT/gpu.json"
GPU_PYTHON ?=
BENCH_GPU_ARGS ?=
ifeq ($(GPU_PYTHON),)
bench-gpu: $(VENV)/.installed
	$(BIN)/python benchmarks/bench_gpu.py $(BENCH_GPU_ARGS)
else
bench-gpu:
	PYTHONPATH=$(CURDIR)/src $(GPU_PYTHON) benchmarks/bench_gpu.py $(BENCH_GPU_ARGS)
endif

clean:
	rm -rf $(VENV) $(BENCH_VENV) runs .pytest_cache .mypy_cache .ruff_cache
