"""``gpu-training report RUN_DIR``: one self-contained HTML page of a run (no network).

The loss and throughput curves, the checkpoints and restarts, the per-rank step parts and
the stall verdicts of a run directory, drawn by the page itself (:mod:`gpu_training.report_page`)::

    $ gpu-training report runs/charlm            # writes runs/charlm/report.html
    $ gpu-training report runs/charlm -o r.html
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``report`` to the ``gpu-training`` parser."""
    parser = subparsers.add_parser(
        "report",
        help="one self-contained HTML page of a run: curves, checkpoints, restarts, ranks",
        description=(
            "Write one HTML file (no network, open it anywhere) with the loss and throughput "
            "curves, the checkpoints and restarts, each rank's step parts and the stall "
            "verdicts of a run directory (its run.output_dir)."
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's output directory")
    parser.add_argument(
        "-o", "--output", metavar="FILE", default=None, help="default RUN_DIR/report.html"
    )
    parser.set_defaults(_run=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    from gpu_training.cli import UsageError
    from gpu_training.report_page import ReportError, write_report

    try:
        path = write_report(args.run_dir, args.output)
    except ReportError as err:
        raise UsageError(f"report: {err}") from None
    except OSError as err:
        raise UsageError(f"report: {err.filename or args.run_dir}: {err.strerror or err}") from None
    print(f"wrote {path}")
    return 0
