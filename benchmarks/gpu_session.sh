#!/usr/bin/env bash
# One prepared GPU session (benchmarks/README.md, "bench_gpu.py"): about 270 s on one H200.
# Runs with the machine's own python3 (a CUDA torch) and this checkout's src/, installs
# nothing, and writes everything under $OUT (default benchmarks/results/gpu-session):
# env.txt, gpu.json + bench.log, tier.log, find_batch.json, doctor.txt.
#   bash benchmarks/gpu_session.sh            # or: OUT=/some/dir PYTHON=python3 bash ...
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu-session}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/tests TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
el() { echo "== $1 at +$(($(date +%s) - T0)) s"; }
{
    nvidia-smi
    $PY -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version(), \
torch.cuda.get_device_name())"
    $PY -m pip list 2>/dev/null | grep -iE '^(torch|pyyaml|rich|xxhash|pytest|pytest-timeout|safetensors|transformers|peft|accelerate|deepspeed|numpy) '
} >"$OUT/env.txt" 2>&1
el env
timeout 250 $PY benchmarks/bench_gpu.py --steps 200 --reps 1 --no-tests --json "$OUT/gpu.json" 2>&1 | tee "$OUT/bench.log"
el bench
timeout 220 $PY -m pytest -q -rs -s -p no:cacheprovider -m 'requires_cuda or requires_gpus' 2>&1 | tee "$OUT/tier.log"
el tier
timeout 120 $PY -m gpu_training find-batch benchmarks/gpt2_124m.yaml --set training.global_batch_size=256 \
    --max-batch 256 --device cuda --json >"$OUT/find_batch.json" 2>"$OUT/find_batch.err"
echo "find-batch rc $?"
$PY -m gpu_training find-batch benchmarks/gpt2_124m.yaml --set training.global_batch_size=256 \
    --max-batch 256 --gpu-memory 140GiB 2>&1 | head -2
el find-batch
timeout 60 $PY -m gpu_training doctor --nproc 1 --checkpoint-dir . >"$OUT/doctor.txt" 2>&1
echo "doctor rc $?"
el done
