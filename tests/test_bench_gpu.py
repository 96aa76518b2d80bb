"""benchmarks/bench_gpu.py: its code paths run (``--smoke``, CPU) so a GPU session is not spent
finding a typo; the real figures need a GPU (``make bench-gpu``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from dist_harness import REPO_ROOT, run_python

SCRIPT = REPO_ROOT / "benchmarks" / "bench_gpu.py"


@pytest.mark.timeout(120)
def test_smoke_run_writes_both_rows(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    args = ["--smoke", "--steps", "12", "--warmup", "4", "--log-every", "4", "--batch", "4"]
    args += ["--tp-reps", "1", "--tp-steps", "6"]
    proc = run_python([str(SCRIPT), *args, "--reps", "1", "--json", str(out)], timeout=100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["formula"].startswith("6N + 12*L*H*Q*T")
    assert result["flops_per_token"] > 0 and result["estimate_bytes"] > 0
    for kind in ("trainer", "manual"):
        row = result["rows"][kind]
        assert math.isfinite(row["tokens_per_s"]) and row["tokens_per_s"] > 0
    assert "Trainer step time / hand-written" in proc.stdout
    if torch.cuda.device_count() < 2:  # the TP row's argument path, skipped without 2 GPUs
        assert "TP row: skipped: needs 2 GPUs" in proc.stdout
        assert result["tp"] == {"skipped": "needs 2 GPUs"}


def test_without_cuda_it_says_so_and_exits_0() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = run_python([str(SCRIPT)], timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.strip() == "bench_gpu: no CUDA device on this machine: nothing to measure"


def test_the_prepared_gpu_session_parses_and_its_job_file_is_valid() -> None:
    """benchmarks/gpu_session.sh is what a lent GPU runs first: a syntax error or a bad job
    file there costs a machine start."""
    import subprocess

    from gpu_training.job import load_job

    session = REPO_ROOT / "benchmarks" / "gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(session)], check=False).returncode == 0
    job = load_job(REPO_ROOT / "benchmarks" / "gpt2_124m.yaml")
    assert job.task.options["n_layer"] == 12 and job.task.options["vocab_size"] == 50304
    assert "gpt2_124m.yaml" in session.read_text()
