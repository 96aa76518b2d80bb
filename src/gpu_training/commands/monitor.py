"""``gpu-training monitor``: a live table of the GPUs, and what looks wrong with them.

Reads NVML (the ``monitor`` extra) or ``nvidia-smi``; ``--replay`` reads recorded
``nvidia-smi --query-gpu`` CSV instead, which is how the rules are tried without a GPU::

    $ gpu-training monitor                 # live table, refreshed every 2 s (Ctrl-C stops)
    $ gpu-training monitor --once --json   # one snapshot for machines

Exit status (:data:`EXIT_NO_GPU` for a health check to act on): 0 when the GPUs were read
(anomalies are reported in the output, not in the status), 1 when there is no GPU to read
(no NVIDIA GPU visible, or a replayed CSV that lists none), 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["EXIT_NO_GPU", "register"]

EXIT_NO_GPU = 1
"""Exit status when there is no GPU to report on: a health check must not read it as success."""

_EPILOG = f"""\
exit status:
  0  the GPUs were read (anomalies, if any, are in the output)
  {EXIT_NO_GPU}  no GPU to report on: NVML and nvidia-smi see no NVIDIA GPU, or the --replay
     CSV lists none; one line on stderr (with --json: {{"gpus": [], ...}} on stdout)
  2  bad input: a flag, an unreadable or malformed --replay file
"""


def register(subparsers: Any) -> None:
    """Add ``monitor`` to the ``gpu-training`` parser."""
    from gpu_training.commands.argtypes import positive_int, refresh_seconds

    parser = subparsers.add_parser(
        "monitor",
        help="live GPU table with anomaly checks (throttling, ECC, stragglers, GPU 0 pile-up)",
        description=(  # broken by hand: the raw formatter keeps the epilog's table as written
            "Show every GPU's utilisation, memory, temperature, power and processes, and flag\n"
            "memory near full, thermal or power throttling, ECC errors, a utilisation\n"
            "imbalance (straggler), every process on GPU 0, and idle GPUs while others work.\n"
            f"Without a GPU it says so in one line and exits {EXIT_NO_GPU}."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--once", action="store_true", help="one snapshot, then exit")
    parser.add_argument("--json", action="store_true", help="JSON (one line per snapshot)")
    parser.add_argument(
        "--interval",
        type=refresh_seconds,
        default=2.0,
        metavar="S",
        help="seconds between refreshes (2)",
    )
    parser.add_argument("--count", type=positive_int, metavar="N", help="stop after N refreshes")
    parser.add_argument(
        "--replay",
        metavar="CSV",
        help="read a recorded `nvidia-smi --query-gpu` CSV instead of the GPUs",
    )
    parser.add_argument(
        "--replay-apps",
        metavar="CSV",
        help="with --replay: recorded `nvidia-smi --query-compute-apps` CSV",
    )
    parser.set_defaults(_run=_run_monitor)


def _snapshot(args: argparse.Namespace) -> list[Any]:
    """The GPUs' states; raises ``NoGPUError`` when there are none (a replay included)."""
    from gpu_training.cli import UsageError
    from gpu_training.monitor import NoGPUError, parse_apps_csv, parse_gpu_csv, query_gpus
    from gpu_training.monitor.query import with_processes

    if args.replay is None:
        if args.replay_apps is not None:
            raise UsageError("monitor: --replay-apps needs --replay")
        return query_gpus()
    try:
        states = parse_gpu_csv(Path(args.replay).read_text(encoding="utf-8"))
        if args.replay_apps is not None:
            apps = parse_apps_csv(Path(args.replay_apps).read_text(encoding="utf-8"))
            states = with_processes(states, apps)
    except OSError as err:
        raise UsageError(f"monitor: cannot read {err.filename}: {err.strerror}") from None
    except ValueError as err:
        raise UsageError(f"monitor: {args.replay}: {err}") from None
    if not states:
        raise NoGPUError(f"no NVIDIA GPU listed in {args.replay}")
    return states


def _table(states: list[Any], anomalies: list[Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=time.strftime("GPUs at %H:%M:%S"), title_justify="left")
    for column in ("GPU", "name", "util", "memory", "temp", "power", "procs", "throttle"):
        table.add_column(column, justify="left" if column in ("name", "throttle") else "right")
    for s in states:
        fraction = s.memory_fraction
        memory = (
            f"{(s.memory_used or 0) / 2**30:.1f}/{(s.memory_total or 0) / 2**30:.1f} GiB "
            f"{fraction:.0%}"
            if fraction is not None
            else "-"
        )
        table.add_row(
            str(s.index),
            s.name,
            f"{s.utilization_gpu:.0f}%" if s.utilization_gpu is not None else "-",
            memory,
            f"{s.temperature_c:.0f}°C" if s.temperature_c is not None else "-",
            f"{s.power_draw_w:.0f} W" if s.power_draw_w is not None else "-",
            str(len(s.processes)) if s.processes is not None else "?",
            ",".join(s.throttle_names) or "-",
        )
    styles = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
    lines = [Text(f"[{a.severity}] {a.message}", style=styles[a.severity]) for a in anomalies]
    if not anomalies:
        lines = [Text("no anomalies", style="green")]
    return Group(table, *lines)


def _run_monitor(args: argparse.Namespace) -> int:
    import json

    from gpu_training.commands._live import refresh_loop
    from gpu_training.monitor import NoGPUError, detect_anomalies, states_to_json

    def frame() -> tuple[str, Any]:
        states = _snapshot(args)
        anomalies = detect_anomalies(states)
        return states_to_json(states, anomalies), _table(states, anomalies)

    try:
        refresh_loop(
            frame, once=args.once, count=args.count, interval=args.interval, as_json=args.json
        )
    except NoGPUError as err:
        message = (
            str(err) if str(err).startswith("no NVIDIA GPU") else (f"no NVIDIA GPU found ({err})")
        )
        if args.json:
            print(json.dumps({"gpus": [], "anomalies": [], "message": message}))
        else:
            print(f"gpu-training: monitor: {message}", file=sys.stderr)
        return EXIT_NO_GPU
    return 0
