"""Probe (issue 31 item 4): a fused read-and-hash into live tensors against today's two passes.

Four processes, each with a 256 MiB "shard" file cold on the disk and a live 256 MiB tensor
(the model/optimizer state it loads into), time, between barriers, the slowest of:

- ``today``: hash the file cold through an 8 MiB reused buffer (``files.file_checksum``), then
  map it (``MAP_POPULATE``) and copy it into the tensor (``dcp_mapped``'s one copy);
- ``fused+snapshot``: snapshot the tensor (``clone``: what a refused load would restore),
  then ``readinto`` the tensor's own memory in 8 MiB slices, hashing each slice as it lands;
- ``fused+slice snapshot``: the snapshot taken slice by slice, each 8 MiB copied out just
  before the read overwrites it (the copy overlaps the kernel's read-ahead);
- ``fused (unsafe)``: the same without the snapshot: the lower bound of any in-place design,
  which cannot leave the tensor untouched when the checksum fails.

    OMP_NUM_THREADS=1 python benchmarks/probe_fused_read.py --rounds 4 --dir /tmp/bw31probe
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import shutil
import statistics
import time
import warnings
from typing import Any

import torch
import xxhash

MiB = 1 << 20
CHUNK = 8 * MiB
MODES = ("today", "fused+snapshot", "fused+slice snapshot", "fused (unsafe)")


def drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm_memory(directory: str, nbytes: int) -> None:
    """As the benchmark's ``--memory warm``: write and unlink an unsynced scratch file."""
    path = os.path.join(directory, "scratch")
    block = os.urandom(16 * MiB)
    with open(path, "wb") as f:
        for _ in range(nbytes // len(block)):
            f.write(block)
    os.unlink(path)


def today(path: str, target: torch.Tensor) -> str:
    h = xxhash.xxh3_64()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        m = mmap.mmap(
            f.fileno(), size, flags=mmap.MAP_PRIVATE | mmap.MAP_POPULATE, prot=mmap.PROT_READ
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        src = torch.frombuffer(m, dtype=torch.uint8, count=size)
    target.view(torch.uint8).copy_(src)
    del src
    m.close()
    return h.hexdigest()


def fused(path: str, target: torch.Tensor, snapshot: bool, sliced: bool = False) -> str:
    keep = target.clone() if snapshot else None
    flat = target.view(torch.uint8)
    saved = torch.empty_like(flat) if sliced else None
    h = xxhash.xxh3_64()
    out = memoryview(flat.numpy())  # type: ignore[arg-type]  # numpy arrays are buffers
    pos = 0
    with open(path, "rb", buffering=0) as f:
        while pos < len(out):
            if saved is not None:
                saved[pos : pos + CHUNK].copy_(flat[pos : pos + CHUNK])
            n = f.readinto(out[pos : pos + CHUNK])
            if not n:
                break
            h.update(out[pos : pos + n])
            pos += n
    del keep, saved
    return h.hexdigest()


def worker(rank: int, args: argparse.Namespace, barrier: Any, results: Any) -> None:
    torch.set_num_threads(1)
    nbytes = args.mib * MiB
    target = torch.full((nbytes // 4,), 1.5)  # live, touched state
    path = os.path.join(args.dir, f"shard{rank}")
    expected = None
    for r in range(args.rounds):
        order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
        for mode in order:
            if rank == 0:
                for i in range(args.ranks):
                    drop(os.path.join(args.dir, f"shard{i}"))
                warm_memory(args.dir, nbytes * args.ranks)
            barrier.wait()
            t0 = time.perf_counter()
            if mode == "today":
                digest = today(path, target)
            else:
                digest = fused(
                    path, target, mode == "fused+snapshot", mode == "fused+slice snapshot"
                )
            dt = time.perf_counter() - t0
            barrier.wait()
            expected = expected or digest
            assert digest == expected, (mode, digest, expected)
            results.put((r, mode, rank, dt))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--dir", default="/tmp/bw31probe")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    for i in range(args.ranks):
        data = torch.randn(args.mib * MiB // 4).view(torch.uint8).numpy().tobytes()
        with open(os.path.join(args.dir, f"shard{i}"), "wb") as f:
            f.write(data)
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(args.ranks), ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(i, args, barrier, results)) for i in range(args.ranks)
    ]
    for proc in procs:
        proc.start()
    rows = [results.get() for _ in range(args.rounds * len(MODES) * args.ranks)]
    for proc in procs:
        proc.join()
    slowest: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for m in MODES:
            slowest[m].append(max(dt for rr, mm, _, dt in rows if rr == r and mm == m))
    gb = args.ranks * args.mib * MiB / 1e9
    for m in MODES:
        s = slowest[m]
        print(
            f"{m:21s} median {statistics.median(s):.3f} s ({gb / statistics.median(s):.2f} GB/s)"
            f"  rounds: {', '.join(f'{x:.3f}' for x in s)}"
        )
    shutil.rmtree(args.dir)


if __name__ == "__main__":
    main()
