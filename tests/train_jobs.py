"""``gpu-training train JOB --nproc N`` for tests whose subject is the run's math, not its launch.

``train --nproc N`` starts the command line (its checks import torch), torchrun's agent and N
fresh workers: N + 2 interpreters importing torch (about 3.6 s of CPU each on the 2-core dev VM) for every run.
Tests about the weights a run ends with (the same on any split, exact resume) need only
the workers: :func:`train` runs the very command a torchrun worker runs (``gpu-training train
JOB`` under torchrun's environment: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_*``) on N
ranks forked from the harness's zygote (:func:`dist_harness.run_ranks`). With one rank there
is no launcher to skip: it runs ``gpu-training train JOB`` in a fresh interpreter, as a user
would.

What the launcher adds — the checks before any process starts, torchrun's report, signals,
the exit codes — is tested through the real command line (tests/test_trainer.py,
tests/test_faults.py, tests/test_preemption.py, tests/test_bad_input.py).
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

from dist_harness import REPO_ROOT, run_python, run_ranks

__all__ = ["train"]


class _Tee(io.TextIOBase):
    """Writes to the rank's stdout (its log) and keeps a copy."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return int(self.stream.write(text))

    def flush(self) -> None:
        self.stream.flush()


def _worker(argv: list[str]) -> str:
    """One rank: what ``python -m gpu_training train JOB`` runs under torchrun; its stdout."""
    from gpu_training.cli import main

    tee = _Tee(sys.stdout)
    sys.stdout = tee
    try:
        code = main(argv)
    finally:
        sys.stdout = tee.stream
    if code != 0:
        raise SystemExit(code)
    return tee.copy.getvalue()


def train(job_file: Path, nproc: int, *extra: str, timeout: float = 300.0) -> str:
    """Trains ``job_file`` on ``nproc`` ranks as ``train --nproc N`` would; fails the test if
    the run fails (with every failing rank's output).

    Args:
        job_file: The job's YAML file (``run.output_dir`` is where its outputs go).
        nproc: Ranks; 1 runs the command line in a fresh interpreter, as a user would.
        *extra: More ``train`` arguments (``--set`` overrides...).
        timeout: Seconds for the whole run.

    Returns:
        What the run printed on stdout (rank 0's: the others print nothing).
    """
    argv = ["train", str(job_file), *extra]
    if nproc == 1:
        proc = run_python(["-m", "gpu_training", *argv], timeout=timeout, cwd=REPO_ROOT)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        return proc.stdout
    outputs = run_ranks(_worker, nproc, args=(argv,), timeout=timeout)
    assert not any(outputs[1:]), f"only rank 0 prints: {outputs[1:]}"
    return str(outputs[0])
