"""Checkpoint bandwidth: sharded save and load against the disk's own sequential bandwidth.

One run measures, on the same disk and in the same minutes:

- the **disk baseline**: one process writes a file of the checkpoint's size in 16 MiB blocks
  and fsyncs it (``dd``-like, plain Python), drops it from the page cache
  (``posix_fadvise(POSIX_FADV_DONTNEED)`` after the fsync: no root needed) and reads it back,
  ``--baseline-reads`` times a round (each read cold; the round's figure is their median: one
  read of this VM's disk swings 2x between neighbours, the toolkit's loads do not);
- the **toolkit**: a model of ``--params`` parameters and its AdamW moments (3 fp32 tensors
  per parameter: what the checkpoint's bytes are) saved and loaded on ``--nproc`` gloo ranks
  through ``Prepared.save_checkpoint`` / ``load_checkpoint`` — the calls the Trainer makes:
  staging directory, per-rank checksums, fsync, manifest, rename; on load the manifest and
  checksums verified, DCP's index checked, ``weights_only`` reads. Each is timed on every rank
  between two barriers and the slowest rank counts. Before each load the checkpoint's files
  are dropped from the page cache the same way, so both reads come from the disk;
- a **resharding load**: the last checkpoint written on ``--nproc`` ranks loaded on
  ``--reshard-nproc`` ranks (FSDP2), timed the same way.

Before every timed side, the disk's and the toolkit's alike, rank 0 puts free memory in the
same state (``--memory``, :func:`settle_memory`): on this VM a page-cache page costs many
times more kernel CPU on memory freed seconds ago than on memory freed just now (figures in
benchmarks/README.md), and which one a side met used to depend on the untimed steps before
it (the saves, after a pause, met the former; the baseline write, after a cache drop, the
latter).

Rounds interleave the baseline and the toolkit. ``% disk`` is the median over rounds of the
toolkit's bandwidth over the disk's measured beside it in the same round (write against write,
read against read), so that other jobs' load drifting between rounds cancels; ``fastest`` is
the fastest toolkit run against the fastest disk run (closest to an idle machine).

Usage::

    python benchmarks/bench_checkpoint_bandwidth.py [--params 84e6] [--nproc 4]
        [--strategies fsdp,ddp] [--rounds 3] [--baseline-reads 3] [--memory warm|cold|as-is] [--dir DIR]
        [--json PATH]

The disk baseline is what a file system of this machine gives one writer; a VM disk may
still be cached by its host below the guest's page cache, which no guest can drop.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # runs from a checkout without an install

GOAL = 0.70  # of the disk's own sequential bandwidth, write and read
BLOCK = 16 << 20
COLD_PAUSE_S = 10.0  # long enough for freed memory to be taken back (README: it is)


# ----------------------------------------------------------------------------------------------
# the disk baseline and the page cache


def drop_cache(path: Path) -> None:
    """Drops ``path``'s (clean) pages from the page cache; a directory: every file in it."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)  # only clean pages can be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_write(path: Path, size: int) -> float:
    """Seconds to write ``size`` bytes sequentially and fsync them (one writer)."""
    block = os.urandom(BLOCK)  # incompressible, in case the disk compresses
    begun = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        left = size
        while left > 0:
            left -= f.write(block[: min(left, BLOCK)])
        os.fsync(f.fileno())
    return time.perf_counter() - begun


def disk_reads(path: Path, times: int, settle: Any) -> float:
    """The median of ``times`` cold reads of ``path`` (cache dropped and ``settle()`` before each)."""
    samples = []
    for _ in range(times):
        drop_cache(path)
        settle()
        samples.append(disk_read(path))
    return statistics.median(samples)


def disk_read(path: Path) -> float:
    """Seconds to read ``path`` sequentially (call :func:`drop_cache` first for a cold read)."""
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    begun = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(view):
            pass
    return time.perf_counter() - begun


def settle_memory(root: Path, size: int, memory: str) -> None:
    """Puts the page cache's free memory in the same state before every timed side.

    On this kind of VM, page-cache pages cost many times more kernel CPU when the memory was
    freed seconds earlier than when it was freed just now (the host takes idle memory back,
    it seems); which state a timed write or read met depended on the untimed steps before it.
    ``warm``: a scratch file of ``size`` bytes is written (never synced: no I/O) and removed
    just before, so every side, the disk's and the toolkit's, starts on just-freed memory.
    ``cold``: a pause, so every side starts on memory taken back. ``as-is``: neither (the
    script before this option).
    """
    if memory == "warm":
        scratch = root / "warm-up.bin"
        block = bytes(BLOCK)
        with open(scratch, "wb", buffering=0) as f:
            for _ in range(-(-size // BLOCK)):
                f.write(block)
        scratch.unlink()  # dirty pages of an unlinked file are dropped, never written
    elif memory == "cold":
        time.sleep(COLD_PAUSE_S)


def dir_bytes(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------------------------
# one torchrun job: every rank builds the model, saves and loads through the toolkit


def _model(params: int) -> Any:
    """Square fp32 linear layers of 4096 (16.8 M parameters each) up to ``params`` (two at least: FSDP2 wraps each)."""
    from torch import nn

    width = 4096
    layers = max(2, round(params / (width * width + width)))
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))


def _timed(ctx: Any, fn: Any, settle: Any = None) -> float:
    """``fn()`` on every rank between two barriers; the slowest rank's seconds, on every rank.

    ``settle()``, if given, runs on rank 0 first (untimed; see :func:`settle_memory`).
    """
    import torch
    import torch.distributed as dist

    if settle is not None and ctx.is_main_process:
        settle()
    dist.barrier()
    begun = time.perf_counter()
    fn()
    dist.barrier()
    took = torch.tensor([time.perf_counter() - begun], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took.item())


def worker(args: argparse.Namespace) -> None:
    """One rank: a step of AdamW (so the moments exist), then rounds of save, drop, load."""
    import torch
    import torch.distributed as dist

    from gpu_training.checkpoint import CheckpointManager
    from gpu_training.config import TrainingConfig
    from gpu_training.ddp import cleanup_distributed, init_distributed
    from gpu_training.resume import capture_run_state
    from gpu_training.strategy import prepare

    ctx = init_distributed("gloo")
    torch.manual_seed(0)
    config = TrainingConfig(
        per_device_batch_size=1, world_size=ctx.world_size, precision="fp32", max_grad_norm=None
    )
    run = prepare(_model(args.params), args.strategy, ctx, config, device="cpu")
    loss = run.model(torch.randn(1, 4096)).square().mean()
    run.steps.backward(loss)
    run.steps.step(0)
    ckpt = CheckpointManager(args.ckpt_dir, ctx=ctx, keep_last_n=None)
    out: dict[str, Any] = {"save": [], "load": [], "bytes": 0, "baseline_write": []}
    out["baseline_read"] = []
    root = Path(args.ckpt_dir)
    probe = root / "dd-probe.bin"

    def settle() -> None:  # rank 0, before every timed side: the disk's and the toolkit's
        settle_memory(root, out["bytes"], args.memory)

    if args.load_step is not None:  # the resharding job: loads what the other job wrote
        step_dir = root / f"step-{args.load_step:08d}"
        if ctx.is_main_process:
            out["bytes"] = dir_bytes(step_dir)
            disk_write(probe, out["bytes"])
        for _ in range(args.rounds):
            if ctx.is_main_process:  # its own read baseline, beside each load
                out["baseline_read"].append(disk_reads(probe, args.baseline_reads, settle))
                drop_cache(step_dir)
            load = lambda: run.load_checkpoint(ckpt, args.load_step)  # noqa: E731
            out["load"].append(_timed(ctx, load, settle))
    else:
        # The process's first save pays one-off set-up (DeepSpeed's and DCP's first save
        # build their planners and engines: ~2 s here, against ~0.5 s for every later one):
        # timed apart, outside the rounds, so a median of 3 is not decided by it.
        run_state = capture_run_state(ctx, step=0)
        out["first_save"] = _timed(ctx, lambda: run.save_checkpoint(ckpt, run_state))
        if ctx.is_main_process:
            out["bytes"] = dir_bytes(root / f"step-{0:08d}")  # what each settle() frees
            shutil.rmtree(root / f"step-{0:08d}")
            os.sync()
        for i in range(args.rounds):
            step = i + 1
            if ctx.is_main_process and i > 0:
                shutil.rmtree(root / f"step-{step - 1:08d}")  # untimed; the disk settles
                os.sync()
            run_state = capture_run_state(ctx, step=step)  # untimed: the Trainer's, too
            out["save"].append(
                _timed(ctx, lambda: run.save_checkpoint(ckpt, run_state), settle)  # noqa: B023
            )
            step_dir = root / f"step-{step:08d}"
            if ctx.is_main_process:
                out["bytes"] = dir_bytes(step_dir)
                drop_cache(step_dir)
                # the baseline, same size, between the toolkit's write and read (others wait)
                settle()
                out["baseline_write"].append(disk_write(probe, out["bytes"]))
                out["baseline_read"].append(disk_reads(probe, args.baseline_reads, settle))
                probe.unlink()
                os.sync()
            load = lambda: run.load_checkpoint(ckpt, step)  # noqa: B023, E731
            out["load"].append(_timed(ctx, load, settle))
    if ctx.is_main_process:
        probe.unlink(missing_ok=True)
        Path(args.result).write_text(json.dumps(out))
    dist.barrier()
    cleanup_distributed()


def _torchrun(nproc: int, argv: list[str], timeout: float) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={nproc}", __file__, "--worker", *argv]
    subprocess.run(cmd, env=env, check=True, timeout=timeout)


def measure(strategy: str, args: argparse.Namespace, work: Path, reshard: bool) -> dict[str, Any]:
    """One strategy's rounds on ``args.nproc`` ranks (and the resharding load if asked)."""
    ckpt_dir = work / strategy
    result = work / f"{strategy}.json"
    common = ["--params", str(args.params), "--rounds", str(args.rounds)]
    common += ["--baseline-reads", str(args.baseline_reads)]
    common += ["--ckpt-dir", str(ckpt_dir), "--result", str(result), "--memory", args.memory]
    _torchrun(args.nproc, ["--strategy", strategy, *common], args.timeout)
    out: dict[str, Any] = json.loads(result.read_text())
    if reshard:
        last = args.rounds
        _torchrun(
            args.reshard_nproc,
            ["--strategy", strategy, "--load-step", str(last), *common],
            args.timeout,
        )
        resharded = json.loads(result.read_text())
        out["reshard_load"] = resharded["load"]
        out["reshard_baseline_read"] = resharded["baseline_read"]
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    return out


# ----------------------------------------------------------------------------------------------
# the report


def _rate(size: int, seconds: float) -> float:
    return size / seconds / 1e9


def _row(label: str, size: int, samples: list[float], base: list[float] | None) -> dict[str, Any]:
    """One line of the table; ``base``: the disk's seconds measured beside each sample."""
    med = statistics.median(samples)
    row: dict[str, Any] = {
        "what": label,
        "bytes": size,
        "median_s": round(med, 3),
        "gb_per_s": round(_rate(size, med), 3),
        "samples_s": [round(s, 3) for s in samples],
    }
    if base is not None:
        # each round against the disk measured beside it: the machine's load drifts between
        paired = [b / s for b, s in zip(base, samples, strict=True)]
        row["share_of_disk"] = round(statistics.median(paired), 3)
        row["share_of_disk_fastest"] = round(min(base) / min(samples), 3)
    return row


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Prints the table and returns the JSON document."""
    rows = []
    verdicts: dict[str, bool] = {}
    for strategy, out in results.items():
        size = out["bytes"]
        write, read = out["baseline_write"], out["baseline_read"]
        rows.append(_row(f"disk write+fsync, 1 writer [{strategy}]", size, write, None))
        rows.append(_row(f"disk read, cache dropped [{strategy}]", size, read, None))
        if "first_save" in out:  # the one-off set-up, beside the rounds (no goal)
            first = f"{strategy} first save (set-up), {args.nproc} ranks"
            rows.append(_row(first, size, [out["first_save"]], None))
        rows.append(_row(f"{strategy} save, {args.nproc} ranks", size, out["save"], write))
        rows.append(_row(f"{strategy} load, {args.nproc} ranks", size, out["load"], read))
        verdicts[f"{strategy}_save"] = rows[-2]["share_of_disk"] >= GOAL
        verdicts[f"{strategy}_load"] = rows[-1]["share_of_disk"] >= GOAL
        if "reshard_load" in out:
            what = f"{strategy} load {args.nproc}->{args.reshard_nproc} ranks"
            rows.append(_row(what, size, out["reshard_load"], out["reshard_baseline_read"]))
    print(f"{'what':<40}{'GB':>6}{'median s':>9}{'GB/s':>6}{'% disk':>7}{'fastest':>8}  samples s")
    for row in rows:
        share = f"{row['share_of_disk']:.0%}" if "share_of_disk" in row else ""
        best = f"{row['share_of_disk_fastest']:.0%}" if "share_of_disk" in row else ""
        print(
            f"{row['what']:<40}{row['bytes'] / 1e9:>6.2f}{row['median_s']:>9.2f}"
            f"{row['gb_per_s']:>6.2f}{share:>7}{best:>8}  "
            + ", ".join(f"{s:.2f}" for s in row["samples_s"])
        )
    for name, ok in verdicts.items():
        print(f"goal {name} >= {GOAL:.0%} of the disk: {'met' if ok else 'MISSED'}")
    return {"table": rows, "goal": GOAL, "goals_met": verdicts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=84e6, help="model parameters (fp32)")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--reshard-nproc", type=int, default=2)
    parser.add_argument("--strategies", default="fsdp,ddp", help="comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--baseline-reads",
        type=int,
        default=3,
        help="cold reads of the disk's file a round (median)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per job")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (same disk)")
    parser.add_argument(
        "--memory",
        choices=("warm", "cold", "as-is"),
        default="warm",
        help="free memory's state before every timed side (settle_memory)",
    )
    parser.add_argument(
        "--json", type=Path, default=ROOT / "benchmarks/results/checkpoint_bandwidth.json"
    )
    # the torchrun job's own arguments
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--ckpt-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--load-step", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.params = int(args.params)
    if args.worker:
        worker(args)
        return 0

    args.json.parent.mkdir(parents=True, exist_ok=True)
    base = args.dir or args.json.parent
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-bw-", dir=base))
    load_before = os.getloadavg()
    results: dict[str, dict[str, Any]] = {}
    try:
        for strategy in args.strategies.split(","):
            results[strategy] = measure(strategy, args, work, reshard=strategy == "fsdp")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    import torch

    print(
        f"{args.params / 1e6:.0f} M fp32 parameters + AdamW moments; fs under {base}; "
        f"torch {torch.__version__}; {os.cpu_count()} CPUs; "
        f"load average {load_before[0]:.1f} -> {load_after[0]:.1f}; "
        f"{args.rounds} rounds, medians; memory {args.memory}; "
        f"{args.baseline_reads} disk reads a round (their median)"
    )
    doc = report(results, args)
    doc.update(
        {
            "benchmark": "checkpoint_bandwidth",
            "date": date.today().isoformat(),
            "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
            "machine": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "torch": torch.__version__,
                "load_average_1min": [round(load_before[0], 2), round(load_after[0], 2)],
            },
            "params": args.params,
            "memory": args.memory,
            "baseline_reads": args.baseline_reads,
            "nproc": args.nproc,
            "reshard_nproc": args.reshard_nproc,
            "raw": results,
        }
    )
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
