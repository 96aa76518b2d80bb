"""The multi-node half of ``gpu-training doctor``: a tiny torchrun job across the nodes.

Run the same ``gpu-training doctor --nnodes M --rdzv-endpoint HOST:PORT`` on every node: each
starts a torchrun agent that joins the c10d rendezvous; the ranks gather their Python, torch,
CUDA, NCCL and gpu-training versions and all-reduce a tensor; each node's local rank 0 writes what it saw and
:func:`probe_nodes` turns it into report lines.

Example:
    >>> data = {"ranks": [{"host": "a", "python": "3.11", "torch": "2.13", "cuda": None,
    ...                    "nccl": None}, {"host": "b", "python": "3.11", "torch": "2.12",
    ...                    "cuda": None, "nccl": None}],
    ...         "backend": "gloo", "all_reduce_ok": True, "all_reduce_value": 2.0,
    ...         "all_reduce_ms": 0.4}
    >>> [check.status for check in _judge_probe(data, nnodes=2, nproc=1, seconds=3.0)]
    ['OK', 'FAIL', 'OK']
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_training.diagnostics.doctor.environment import collect_facts
from gpu_training.diagnostics.doctor.report import FAIL, OK, DoctorCheck

__all__ = ["probe_nodes"]


def probe_nodes(
    *,
    nnodes: int,
    nproc: int,
    rdzv_endpoint: str,
    rdzv_id: str | None = None,
    timeout: float = 120.0,
) -> list[DoctorCheck]:
    """Run a tiny torchrun job across the nodes: versions on every rank, one all-reduce.

    Run the same call on every node. Each node's agent joins the c10d rendezvous at
    ``rdzv_endpoint``; the ranks gather their versions and all-reduce a tensor.

    Args:
        nnodes: Nodes that must join.
        nproc: Processes per node.
        rdzv_endpoint: ``host:port`` of the rendezvous (the rank-0 node).
        rdzv_id: Job id (default: derived from the endpoint, the same on every node).
        timeout: Seconds for the whole probe, rendezvous included.

    Returns:
        ``nodes``, ``versions`` and ``all_reduce`` lines (a FAIL line if the job did not
        complete).
    """
    from gpu_training.launcher import launch_env, parse_endpoint

    host, port = parse_endpoint(rdzv_endpoint)
    job = rdzv_id or f"gpu-training-doctor-{host}-{port}"
    with tempfile.TemporaryDirectory(prefix="gpu-training-doctor-") as tmp:
        result = Path(tmp) / "probe.json"
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nnodes}",
            f"--nproc_per_node={nproc}",
            f"--log-dir={Path(tmp) / 'torchrun'}",  # else torchrun leaves /tmp/torchelastic_*
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint={rdzv_endpoint}",
            f"--rdzv_id={job}",
            f"--rdzv_conf=join_timeout={max(1, int(timeout))}",
            "--module",
            "gpu_training.diagnostics.doctor.probe",
            "--probe",
            str(result),
        ]
        env = launch_env(os.environ, nproc_per_node=nproc)
        started = time.monotonic()
        try:
            proc = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return [
                DoctorCheck(
                    "nodes",
                    FAIL,
                    f"the probe job did not complete within {timeout:g}s",
                    f"run the same doctor command on all {nnodes} nodes with the same "
                    "--rdzv-endpoint; check the endpoint is reachable",
                )
            ]
        if proc.returncode != 0 or not result.exists():
            tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-1:])[:300]
            return [
                DoctorCheck(
                    "nodes",
                    FAIL,
                    f"the probe job failed (exit code {proc.returncode}): {tail}",
                    "see the NCCL/gloo error; NCCL_DEBUG=INFO shows the interfaces it tried",
                )
            ]
        data = json.loads(result.read_text())
    return _judge_probe(data, nnodes, nproc, time.monotonic() - started)


def _judge_probe(
    data: Mapping[str, Any], nnodes: int, nproc: int, seconds: float
) -> list[DoctorCheck]:
    ranks: list[dict[str, Any]] = data["ranks"]
    hosts = sorted({r["host"] for r in ranks})
    checks = [
        DoctorCheck(
            "nodes",
            OK if len(ranks) == nnodes * nproc else FAIL,
            f"{len(ranks)} ranks joined from {len(hosts)} host(s) ({', '.join(hosts)}) "
            f"in {seconds:.1f}s",
            "" if len(ranks) == nnodes * nproc else f"expected {nnodes * nproc} ranks",
        )
    ]
    mismatched = []
    for key in ("python", "torch", "cuda", "nccl", "gpu_training"):
        values = {str(r.get(key)) for r in ranks}
        if len(values) > 1:
            by = ", ".join(f"{r['host']}:{r.get(key)}" for r in ranks)
            mismatched.append(f"{key} differs ({by})")
    if mismatched:
        checks.append(
            DoctorCheck(
                "versions",
                FAIL,
                "; ".join(mismatched),
                "install the same Python, torch, CUDA and gpu-training on every node",
            )
        )
    else:
        first = ranks[0]
        package = f", gpu-training {first['gpu_training']}" if first.get("gpu_training") else ""
        checks.append(
            DoctorCheck(
                "versions",
                OK,
                f"identical on every rank: python {first['python']}, torch {first['torch']}, "
                f"CUDA {first['cuda']}, NCCL {first['nccl']}{package}",
            )
        )
    if data["all_reduce_ok"]:
        checks.append(
            DoctorCheck(
                "all_reduce",
                OK,
                f"completed on {data['backend']} in {data['all_reduce_ms']:.1f} ms, result correct",
            )
        )
    else:
        checks.append(
            DoctorCheck(
                "all_reduce",
                FAIL,
                f"wrong result on {data['backend']}: {data['all_reduce_value']}",
                "a broken network path or driver; run with NCCL_DEBUG=INFO",
            )
        )
    return checks


def _probe_worker(result: str) -> None:
    """One rank of :func:`probe_nodes` (``python -m gpu_training.diagnostics.doctor.probe``)."""
    import torch
    import torch.distributed as dist

    from gpu_training.ddp import cleanup_distributed, init_distributed

    ctx = init_distributed()
    try:
        facts = collect_facts()
        mine = {
            "rank": ctx.rank,
            "host": socket.gethostname(),
            "python": facts.python,
            "torch": facts.torch,
            "cuda": facts.cuda_build,
            "nccl": facts.nccl,
            "gpu_training": facts.package,
        }
        ranks: list[Any] = [None] * ctx.world_size
        if ctx.is_distributed:
            dist.all_gather_object(ranks, mine)
        else:
            ranks = [mine]
        device = torch.device("cuda", ctx.local_rank) if ctx.backend == "nccl" else None
        value = torch.ones(1, device=device)
        started = time.perf_counter()
        if ctx.is_distributed:
            dist.all_reduce(value)
        elapsed = (time.perf_counter() - started) * 1000
        total = float(value.item())
        if ctx.local_rank == 0:
            payload = {
                "ranks": ranks,
                "backend": ctx.backend or "none",
                "all_reduce_ok": total == ctx.world_size,
                "all_reduce_value": total,
                "all_reduce_ms": elapsed,
            }
            tmp = Path(result + ".tmp")
            tmp.write_text(json.dumps(payload))
            os.replace(tmp, result)
    finally:
        cleanup_distributed()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--probe":
        raise SystemExit("usage: python -m gpu_training.diagnostics.doctor.probe --probe RESULT")
    from gpu_training.watchdog import entry_point

    entry_point(_probe_worker)(sys.argv[2])
