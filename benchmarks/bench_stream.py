"""What reading a stream costs a rank: every record read, only its own decoded.

The built-in task's JSONL stream (``task_options.stream``), one window of 128 characters per
record, read as one rank of ``W`` reads it (``RankStream``: every record of every step read,
its own ``1/W`` decoded and collated), for W = 1, 2 and 4, in one process, plus the cost of
reopening the stream at its last record (a resume's skip). Each figure is the median of
``--rounds`` in CPU time (``process_time``: steadier than wall time on a shared machine); the
ratio is a rank's time on W ranks over one rank's time on 1 (ideal 1/W).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_stream.py [--records 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from torch.utils.data import default_collate

from gpu_training.streaming import RankStream, StreamPosition
from gpu_training.tasks.charlm import build_datasets
from gpu_training.tasks.streams import char_stream

G, B, BLOCK = 64, 8, 128


def _write(path: Path, n: int) -> None:
    text = "In the beginning God created the heaven and the earth. " * 3
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "text": f"{i} {text}"}) + "\n")


def _rank_pass(stream: object, world: int) -> float:
    position = StreamPosition(G)
    rank0 = RankStream(
        stream,  # type: ignore[arg-type]
        position,
        rank=0,
        world_size=world,
        per_device_batch_size=B,
        accumulation=G // (world * B),
        collate=default_collate,
    )
    start = time.process_time()
    for _ in rank0:
        pass
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = Path(tempfile.mkdtemp()) / "stream.jsonl"
    _write(path, args.records)
    tokenizer = build_datasets(block_size=BLOCK).tokenizer
    stream = char_stream(str(path), tokenizer, BLOCK, reader="files", text_field="text")
    times = {
        w: statistics.median(_rank_pass(stream, w) for _ in range(args.rounds)) for w in (1, 2, 4)
    }
    skips = []
    for _ in range(args.rounds):
        start = time.process_time()
        next(stream.records(args.records - 1))
        skips.append(time.process_time() - start)
    size = path.stat().st_size / 1e6
    print(f"{args.records} records, {size:.1f} MB JSONL, G {G}, B {B}, window {BLOCK}")
    for w, t in times.items():
        print(f"rank 0 of {w}: {t:.2f} s  ratio to 1 rank {t / times[1]:.3f} (ideal {1 / w:.3f})")
    print(f"reopen at the last record: {statistics.median(skips):.3f} s")


if __name__ == "__main__":
    main()
