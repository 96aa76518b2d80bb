"""``gpu-training watch RUN_DIR``: every rank of a running job, live, from its files.

Reads ``RUN_DIR/telemetry/rank<N>.jsonl`` (each rank's step records), ``metrics.jsonl`` and
the checkpoint directory; never joins the job, so it runs anywhere the files are (over SSH,
on a login node, after the job died)::

    $ gpu-training watch runs/demo            # refreshed every 2 s (Ctrl-C stops)
    $ gpu-training watch runs/demo --once     # one table, then exit
    $ gpu-training watch runs/demo --once --json

One row per rank (its step, the step's time split into data, compute, collectives,
optimizer and checkpoint, its arrival lag at the first gradient collective, its memory),
then the straggler verdict in words, loss, throughput, MFU, ETA and cost, the last committed
checkpoint and the watchdog's verdict if a rank stalled.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

__all__ = ["register"]

_EPILOG = """\
the verdict:
  Every rank's step time is the same in a synchronous job: the gradient all-reduce makes
  the fast ranks wait for the slowest. What tells them apart is when each rank *arrives* at
  the step's first gradient collective (its own data and compute before it). A rank that
  arrives late is named with the cause: its data loading (it waited longer for the loader)
  or its compute.

exit status:
  0  shown
  2  bad input: RUN_DIR missing, or no telemetry in it (run.telemetry: false, another dir)
"""


def register(subparsers: Any) -> None:
    """Add ``watch`` to the ``gpu-training`` parser."""
    from gpu_training.commands.argtypes import positive_int, refresh_seconds

    parser = subparsers.add_parser(
        "watch",
        help="live per-rank view of a run from its files: step-time split, straggler, ETA, cost",
        description=(
            "Show every rank of a run (step, step time split into data, compute, collectives,\n"
            "optimizer and checkpoint, arrival lag, memory), which rank is slow and why,\n"
            "loss, throughput, MFU, ETA, cost so far and the last committed checkpoint,\n"
            "from the files the run writes. It never joins the job."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's run.output_dir")
    parser.add_argument("--once", action="store_true", help="show once, then exit")
    parser.add_argument("--json", action="store_true", help="JSON (one line per refresh)")
    parser.add_argument(
        "--interval",
        type=refresh_seconds,
        default=2.0,
        metavar="S",
        help="seconds between refreshes (2)",
    )
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=5,
        metavar="N",
        help="recent steps the rows and the verdict read (5)",
    )
    parser.add_argument("--count", type=positive_int, metavar="N", help="stop after N refreshes")
    parser.set_defaults(_run=_run_watch)


def _ms(value: float | None) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds:
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _memory(row: Any) -> str:
    return "-" if row.memory_bytes is None else f"{row.memory_bytes / 2**30:.2f}G"


def _render(view: Any) -> Any:
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    total = f"/{view.total_steps}" if view.total_steps else ""
    title = (
        f"{view.run_dir} | {view.strategy} on {view.world_size} rank(s), {view.device_name} | "
        f"step {view.step}{total} | {time.strftime('%H:%M:%S')}"
    )
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )
    kind = view.rows[0].memory_kind if view.rows else ""
    memory = "mem peak" if kind == "cuda_peak" else "mem rss"
    columns = ("rank", "step", "step", "data", "comp", "comm", "optim", "ckpt", "lag", memory)
    for column in (*columns, "age"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in view.rows:
        table.add_row(
            str(row.rank),
            str(row.step),
            _ms(row.step_ms),
            _ms(row.data_ms),
            _ms(row.compute_ms),
            _ms(row.comm_ms),
            _ms(row.optimizer_ms),
            _ms(row.checkpoint_ms),
            _ms(row.lag_ms),
            _memory(row),
            f"{row.age_s:.0f}s",
        )
    late = view.straggler.get("rank") is not None
    lines = [
        Text(
            f"ms, medians of the last {view.straggler.get('steps') or '-'} steps; lag: arrival "
            "at the first gradient collective behind the earliest rank",
            style="dim",
        ),
        Text(view.verdict, style="bold yellow" if late else "green"),
    ]
    facts = []
    if view.loss is not None:
        facts.append(f"loss {view.loss:.4f}")
    if view.tokens_per_s:
        facts.append(f"{view.tokens_per_s:,.0f} tokens/s")
    elif view.samples_per_s:
        facts.append(f"{view.samples_per_s:,.1f} samples/s")
    facts.append(f"MFU {view.mfu:.1%}" if view.mfu is not None else "MFU n/a (unknown peak)")
    facts.append(f"ETA {_duration(view.eta_s)}")
    if view.cost_so_far is not None:
        facts.append(
            f"cost so far ${view.cost_so_far:,.2f} ({view.world_size} GPUs x "
            f"${view.price_per_gpu_hour:.2f}/h for {_duration(view.elapsed_s)})"
        )
    else:
        facts.append(f"running {_duration(view.elapsed_s)} (no price for {view.device_name})")
    lines.append(Text(" | ".join(facts)))
    lines.append(Text(f"last checkpoint: {view.checkpoint or 'none committed yet'}"))
    if view.stall:
        lines.append(Text(f"watchdog: {view.stall}", style="bold red"))
    return Group(table, *lines)


def _run_watch(args: argparse.Namespace) -> int:
    from gpu_training.commands._live import refresh_loop
    from gpu_training.commands._watch_view import build_view

    def frame() -> tuple[str, Any]:
        view = build_view(args.run_dir, steps=args.steps)
        return json.dumps(view.to_json()), _render(view)

    refresh_loop(frame, once=args.once, count=args.count, interval=args.interval, as_json=args.json)
    return 0
