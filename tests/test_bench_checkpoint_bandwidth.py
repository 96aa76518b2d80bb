"""Tests for benchmarks/bench_checkpoint_bandwidth.py's disk baseline and its table.

The benchmark itself (a 1 GB model on 4 ranks) runs by hand; here: the disk's read baseline
is the median of several cold reads, each one after the file left the page cache, and a
round's ``% disk`` is the toolkit's seconds against the disk's of the same round. No test
depends on a time: the clock is replaced.
"""

from __future__ import annotations

import io
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bench_scripts import load_benchmark
from dist_harness import REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "bench_checkpoint_bandwidth.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("bench_checkpoint_bandwidth")


def test_the_read_baseline_is_the_median_of_cold_reads(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = tmp_path / "probe.bin"
    bench.disk_write(probe, 3 * 1024 * 1024)
    order: list[str] = []
    real_drop = bench.drop_cache
    seconds = iter([0.9, 0.3, 0.5])

    def drop(path: Path) -> None:
        order.append("drop")
        real_drop(path)  # the real call: posix_fadvise works on this file system

    def read(path: Path) -> float:
        order.append("read")
        assert path == probe and path.stat().st_size == 3 * 1024 * 1024
        return next(seconds)

    monkeypatch.setattr(bench, "drop_cache", drop)
    monkeypatch.setattr(bench, "disk_read", read)
    settled: list[int] = []
    median = bench.disk_reads(probe, 3, lambda: settled.append(1))
    assert median == 0.5  # not the first read, not the fastest: the middle one
    assert order == ["drop", "read"] * 3  # every read starts cold
    assert len(settled) == 3  # and with the memory in the same state


def test_disk_read_reads_the_whole_file(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = tmp_path / "probe.bin"
    size = bench.BLOCK + 12345  # a partial last block
    bench.disk_write(probe, size)
    assert probe.stat().st_size == size
    bench.drop_cache(probe)
    got: list[int] = []

    class Counting(io.FileIO):
        def readinto(self, buffer: Any) -> int:
            n = super().readinto(buffer) or 0
            got.append(n)
            return n

    monkeypatch.setattr(
        bench, "open", lambda path, mode, buffering: Counting(path, "r"), raising=False
    )
    assert bench.disk_read(probe) > 0.0
    assert sum(got) == size and got[-1] == 0  # every byte, then the end of the file


def test_a_round_is_measured_against_its_own_disk(bench: ModuleType) -> None:
    # the disk read 0.5 s then 1.0 s; the toolkit 1.0 s in both rounds: 50% and 100%
    row = bench._row("load", int(1e9), [1.0, 1.0], [0.5, 1.0])
    assert row["share_of_disk"] == pytest.approx(0.75)  # the median of the paired rounds
    assert row["share_of_disk_fastest"] == pytest.approx(0.5)
    assert row["gb_per_s"] == pytest.approx(1.0)


def test_the_baseline_reads_reach_the_ranks(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr(bench, "_torchrun", lambda nproc, argv, timeout: seen.append(argv))
    args = bench.argparse.Namespace(
        params=1, rounds=2, baseline_reads=5, memory="warm", timeout=1.0, nproc=4
    )
    with pytest.raises(FileNotFoundError):  # no rank ran, so no result file
        bench.measure("fsdp", args, tmp_path, reshard=False)
    assert seen and "--baseline-reads" in seen[0]
    assert seen[0][seen[0].index("--baseline-reads") + 1] == "5"
