"""torchrun with a quiet, consistent end: ``python -m gpu_training.launcher.torchrun FLAGS...``.

This is torch's own torchrun (``torch.distributed.run``: same flags, same agent, same
restarts); :func:`~gpu_training.launcher.run_torchrun` starts it in place of
``python -m torch.distributed.run``. Only the way it ends changes:

* **stopped by a signal** (SIGTERM, SIGINT, SIGHUP, SIGQUIT or SIGUSR1, which torchrun passes
  on to the workers; they save and stop): exit code 143, and no 30-line ``SignalException``
  traceback of torchrun's own;
* **a worker exited with 143** (the signal reached the workers, not torchrun; the others
  exited 143 too, or were stopped by torchrun on their way out): 143 as well, without
  torchrun's failure report, so the code is the same whichever process was signalled;
* **bad input found in the ranks** (the root-cause worker exited 2: a refused resume, a full
  disk, data too small for one global batch — the same on every rank): the error's one
  line, ``gpu-training: error: ...``, and exit code 2, as when the launching host finds it;
* **the run stopped for NaN/Inf steps** (every worker exited 3 at the same step: too many
  non-finite steps in a row): the error's one line and exit code 3;
* **a multi-node job ended**: the agent hosting the rendezvous store keeps it up until every
  other agent has left it (:class:`~gpu_training.launcher.rendezvous_store.StoreHold`), so
  none prints a traceback for an exit barrier or a rendezvous that lost its store;
* **a worker failed**: torchrun's report (the "Root Cause" rank, its exception and
  traceback) as the last block of the output, exit code 1, without the traceback of
  torchrun's internals above it.

:func:`run_here` runs the same agent inside the calling process instead (``gpu-training
train --nproc N``, which has imported torch for its checks already): one interpreter and one
torch import less per job, and the same endings.

torch is imported when this runs, not when :mod:`gpu_training.launcher` is.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import FrameType

from gpu_training.launcher.rendezvous_store import (
    FAILED_LEAVE_TIMEOUT_S,
    LEAVE_TIMEOUT_S,
    StoreHold,
)
from gpu_training.launcher.supervise import (
    EXIT_STOPPED,
    FORWARDED_SIGNALS,
    OWNED_LOG_DIR_ENV,
    Janitor,
    own_log_dir,
)

__all__ = ["EXIT_NONFINITE", "EXIT_USAGE", "QUIET_ENV", "main", "run_here"]

EXIT_USAGE = 2
"""A worker's exit code for bad input it found (``gpu_training.cli``'s usage code)."""

EXIT_NONFINITE = 3
"""Every worker's exit code when the run stopped itself at ``training.max_nonfinite_steps``
NaN/Inf steps in a row (the same decision on every rank; the last checkpoint is intact)."""

QUIET_ENV = "GPU_TRAINING_QUIET_TORCHRUN"
"""Set for the workers: their bad-input line is printed once, here, not by rank 0 too."""


class _Repeats(logging.Filter):
    """Drops the agent's lines that the ending above says better (or that bad input makes noise).

    "failed (exitcode: N) local_rank: ..." comes before torchrun's report, which names the
    same rank and code; "Sending process P closing signal SIGTERM" is torchrun stopping the
    other ranks after one failed, which every failure does.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        return not (text.startswith("failed (exitcode") or "closing signal" in text)


@contextlib.contextmanager
def _quiet_logging_errors() -> Iterator[None]:
    """Log records that fail to write are dropped, not reported with a traceback.

    srun (and a user's second Ctrl-C) can signal torchrun twice. The second signal raises
    torchrun's ``SignalException`` inside its handler's ``emit`` of "Received 15 death
    signal, shutting down workers", which :mod:`logging` would report as a 20-line
    "--- Logging error ---" traceback in the middle of a clean stop (seen under load in
    ``tests/test_slurm_cluster.py``). The agent shuts the workers down for the first signal
    either way; the line it could not write is lost.
    """
    previous = logging.raiseExceptions
    logging.raiseExceptions = False
    try:
        yield
    finally:
        logging.raiseExceptions = previous


def _from_signal(exc: BaseException, signal_type: type[BaseException]) -> bool:
    """Whether ``exc`` was raised while torchrun handled a stop signal."""
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            return False
        if isinstance(current, signal_type):
            return True
        current = current.__context__
    return False


def _usage_line(failure: object, only: str | None = None) -> str | None:
    """``gpu-training: error: ...`` from a worker's error record (None without one, or when
    ``only`` is given and the recorded exception is not of that name)."""
    data = getattr(failure, "error_file_data", None) or {}
    record = data.get("message") if isinstance(data, dict) else None
    text = record.get("message") if isinstance(record, dict) else None
    if not isinstance(text, str) or not text.strip():
        return None
    name, sep, rest = text.partition(": ")  # "ResumeError: 2 damaged checkpoints ..."
    if only is not None and name != only:
        return None
    message = rest if sep and name.isidentifier() else text
    return f"gpu-training: error: {' '.join(message.split())}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run torchrun with ``argv`` (default ``sys.argv[1:]``) and return the job's exit code.

    Args:
        argv: torchrun's command line, without the program.

    Returns:
        0, 143 when a signal stopped the job, 2 when the ranks found bad input, 3 when the
        run stopped for NaN/Inf steps, 1 when a worker failed.
    """
    from torch.distributed.run import parse_args

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_Repeats())
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    owned = os.environ.get(OWNED_LOG_DIR_ENV)
    os.environ[QUIET_ENV] = "1"  # the workers inherit it
    hold = StoreHold.start(args)  # before torchrun's agent looks for the store's server
    code = 1
    try:
        code = _run(args)
        return code
    finally:
        if hold is not None:  # the store is up until every agent has left it
            # a failed job ends within seconds, even where another agent's workers hang
            ended_well = code in (0, EXIT_STOPPED)
            hold.release(LEAVE_TIMEOUT_S if ended_well else FAILED_LEAVE_TIMEOUT_S)
        if owned and owned == os.environ.get("PET_LOG_DIR"):
            shutil.rmtree(owned, ignore_errors=True)  # the launcher may have been SIGKILLed


def _run(args: argparse.Namespace) -> int:
    """torchrun's ``run(args)``, its ending made the job's exit code (see :func:`main`)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ErrorHandler
    from torch.distributed.run import run

    try:
        with _quiet_logging_errors():
            run(args)
    except SignalException:
        # torchrun has passed the signal on and waited for its workers (30 s, then SIGKILL)
        return EXIT_STOPPED
    except ChildFailedError as failed:
        codes = {failure.exitcode for failure in failed.failures.values()}
        # a worker exits 143 only after the stop step's checkpoint is committed on every rank;
        # torchrun then SIGTERMs the others, which may still be on their way out
        if EXIT_STOPPED in codes and codes <= {EXIT_STOPPED, -signal.SIGTERM}:
            return EXIT_STOPPED
        _, root = failed.get_first_failure()
        if root.exitcode == EXIT_USAGE:  # the ranks' bad input: one line, as before a launch
            line = _usage_line(root)
            if line is not None:
                print(line, file=sys.stderr, flush=True)
            return EXIT_USAGE
        # the run stopped itself for NaNs (a user script's own exit 3 keeps torchrun's report)
        line = _usage_line(root, only="NonFiniteError")
        if root.exitcode == EXIT_NONFINITE and line is not None:
            print(line, file=sys.stderr, flush=True)
            return EXIT_NONFINITE
        if os.environ.get("TORCHELASTIC_ERROR_FILE") and os.path.isfile(root.error_file):
            ErrorHandler().dump_error_file(root.error_file, root.exitcode)  # for its own agent
        print(failed.format_msg(), file=sys.stderr, flush=True)
        return 1
    except Exception as exc:
        # torch's metrics wrapper can be hit by the signal before it sets its own variable,
        # and raises UnboundLocalError "during handling of" the SignalException (now and
        # then: benchmarks/README.md, "Traps"): the same stop, whatever torch's own says
        if _from_signal(exc, SignalException):
            return EXIT_STOPPED
        raise
    return 0


def run_here(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run torchrun's agent in this process, with ``env``, and return the job's exit code.

    What :func:`~gpu_training.launcher.run_torchrun` adds around a torchrun child, for the
    agent in this process:

    * **Signals.** The agent itself handles :data:`FORWARDED_SIGNALS` (given
      ``--signals-to-handle``): it passes them on to every worker and the job ends with 143.
      One that comes before its handlers are in place (during the rendezvous) ends the job
      the same way; no worker has started yet.
    * **No orphans, nothing left in /tmp.** If this process is killed, a
      :class:`~gpu_training.launcher.supervise.Janitor` sends the workers ``SIGTERM``
      (``SIGKILL`` 30 s later) and removes torchrun's log directory.
    * The exit codes of :func:`main`.

    ``os.environ`` becomes ``env`` plus torchrun's own variables (the workers inherit it):
    call this as the last thing a process does, from its main thread.

    Args:
        argv: torchrun's command line, without the program (flags, then the target).
        env: The environment for the agent and its workers (see
            :func:`~gpu_training.launcher.launch_env`).

    Returns:
        The job's exit code, as :func:`main`'s.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise SignalException(f"Process {os.getpid()} got signal: {signum}", signal.Signals(signum))

    os.environ.update(env)
    log_dir = own_log_dir(argv, os.environ)
    previous: dict[signal.Signals, object] = {}
    try:
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, stop) for sig in FORWARDED_SIGNALS}
        with Janitor(log_dir):
            return main(argv)
    except SignalException:  # before torchrun's own handling (which returns 143 too)
        return EXIT_STOPPED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        if log_dir is not None:
            shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
