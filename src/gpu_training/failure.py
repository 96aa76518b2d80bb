"""What a rank does once it has failed: no collective, the culprit on record, no waiting.

A rank that raises must not enter a barrier or any other collective on its way out: its peers
are blocked in a *different* collective (DDP's gradient all-reduce, the next log step's
reduce), so the barrier never completes and the whole job sits silent until the
process-group timeout (docs/design.md, "Traps"). The helpers here let teardown code tell the two
paths apart and end the failing one fast:

* :func:`exception_in_flight` — the exception this thread is raising or handling, as seen
  from a ``finally:`` block, an ``except`` block or an ``__exit__`` (a ``SystemExit`` of 0
  is a success, not a failure);
* :func:`is_peer_failure` — whether an error only says that *another* rank went away
  (gloo's ``Connection closed by peer``, NCCL's remote error): the rank that raised it is a
  victim, not the culprit;
* :func:`record_failure` — torchrun's error record for this rank, written at once (not when
  the exception finally leaves ``main``, which a rank that is then killed never reaches),
  timed so that torchrun's "Root Cause" is the rank that failed first, not a victim that
  failed within the same second;
* :func:`let_culprit_be_seen` — a victim stays alive a moment, so that torchrun sees the
  culprit exit first (and stops the victim itself);
* :func:`one_line` — an exception as the one line a failed rank prints before its traceback,
  with torch's collective fingerprints shortened so that both ranks of a mismatch fit;
* :func:`exit_if_stuck` — a deadline for teardown: past it, the exception is reported and the
  process ends with ``os._exit(1)``. Destroying a gloo group waits for this rank's unfinished
  collectives, which a peer blocked elsewhere never completes (it waited until that peer
  exited by itself: benchmarks/README.md, "Traps"), and the peer in turn waits for this rank
  to exit.

No torch import: :mod:`gpu_training.ddp` and the diagnostics build on it.

Example:
    >>> try:
    ...     raise RuntimeError("boom")
    ... except RuntimeError:
    ...     type(exception_in_flight()).__name__
    'RuntimeError'
    >>> exception_in_flight() is None
    True
    >>> is_peer_failure(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1415"))
    True
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import NoReturn

__all__ = [
    "FAILED_TEARDOWN_TIMEOUT_S",
    "VICTIM_DELAY_S",
    "VICTIM_GRACE_S",
    "end_failed_rank",
    "exception_in_flight",
    "exit_if_stuck",
    "exit_now",
    "is_peer_failure",
    "let_culprit_be_seen",
    "one_line",
    "record_failure",
    "report_and_exit",
    "write_error_record",
]

FAILED_TEARDOWN_TIMEOUT_S = 3.0
"""Seconds a failed rank may spend tearing down its process group before it exits anyway."""

VICTIM_GRACE_S = 2.0
"""Seconds a victim of another rank's failure stays alive, so torchrun sees the culprit first."""

VICTIM_DELAY_S = 2
"""Seconds a victim's torchrun record is post-dated by, so the culprit's is the earliest."""

# What a rank's collective raises when another rank died or closed its connections.
_PEER_FAILURE = re.compile(
    r"connection closed by peer|connection reset by peer|broken pipe|"
    r"remote process exited|ncclRemoteError|NCCL communicator was aborted|"
    r"failed to recv, got 0 bytes|socket closed",
    re.IGNORECASE,
)
_RANK_NAMED = re.compile(r"\brank (\d+)\b", re.IGNORECASE)  # "rank 1: ...", "Rank 0 is running"
# The device options torch's debug wrapper prints in each collective fingerprint (one level
# of nested parentheses: "dtype=float (default)"); its TensorDtypes already names the dtype.
_FINGERPRINT_OPTIONS = re.compile(r",? ?TensorDeviceTypes=TensorOptions\((?:[^()]|\([^()]*\))*\)")
_recorded: dict[int, int] = {}
_waited: set[int] = set()  # id(exception) -> the timestamp its record was written with


def exception_in_flight() -> BaseException | None:
    """The exception the calling thread is raising or handling; None on the success path.

    Inside a ``finally:`` block that runs because of an exception, in an ``except`` block and
    in ``__exit__`` (checked on CPython 3.10 to 3.13), :func:`sys.exc_info` holds that
    exception; after a ``try`` that completed it holds nothing. A ``SystemExit`` with code 0
    or None is a normal end and counts as no failure; any other ``SystemExit``,
    ``KeyboardInterrupt`` included, does.

    Returns:
        The exception, or None.

    Example:
        >>> try:
        ...     raise SystemExit(0)
        ... except SystemExit:
        ...     exception_in_flight() is None
        True
    """
    exc = sys.exc_info()[1]
    if isinstance(exc, SystemExit) and exc.code in (0, None):
        return None
    return exc


def one_line(exc: BaseException, limit: int = 500) -> str:
    """``Type: message`` on one line of at most ``limit`` characters.

    Whitespace runs become one space. torch's collective fingerprints
    (``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s "Detected mismatch between collectives") lose their
    ``TensorDeviceTypes=TensorOptions(...)`` part, about 170 characters each that would push
    the second rank's operation past the limit. A longer text ends in "...".

    Args:
        exc: The exception.
        limit: The most characters returned.

    Returns:
        The line.

    Example:
        >>> one_line(RuntimeError("bad\\n  value"))
        'RuntimeError: bad value'
        >>> one_line(ValueError("x" * 50), limit=20)
        'ValueError: xxxx...'
    """
    text = _FINGERPRINT_OPTIONS.sub("", " ".join(f"{type(exc).__name__}: {exc}".split()))
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def is_peer_failure(exc: BaseException, rank: int | None = None) -> bool:
    """True when ``exc`` only tells this rank about another rank's failure.

    Either a collective saw another rank go away (gloo's ``Connection closed by peer``,
    NCCL's remote error; in ``exc`` or an exception it was raised from), or ``exc`` relays an
    error shared by the ranks and names other ranks only (``could not save step 2: rank 1:
    RuntimeError: ...`` as raised on rank 0).

    Args:
        exc: The exception.
        rank: This process's rank (default: ``RANK``, else 0).

    Returns:
        Whether this rank is a victim of another rank's failure.

    Example:
        >>> is_peer_failure(ValueError("bad batch")), is_peer_failure(RuntimeError("Broken pipe"))
        (False, True)
        >>> is_peer_failure(OSError("could not save: rank 1: disk full"), rank=0)
        True
    """
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if _PEER_FAILURE.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
        seen += 1
    named = {int(n) for n in _RANK_NAMED.findall(str(exc))}
    own = int(_rank()) if rank is None else rank
    return bool(named) and own not in named


def _rank() -> str:
    return os.environ.get("RANK", "0") or "0"


def let_culprit_be_seen(exc: BaseException) -> None:
    """A victim under torchrun waits :data:`VICTIM_GRACE_S` before exiting (once per error).

    torchrun names as "Root Cause" the earliest record among the ranks it has seen exit; a
    rank that was SIGKILLed writes none, and is dated when torchrun notices it, which a busy
    machine delays past the victim's own record (seen in the fault matrix: the victim named).
    Still alive, the victim is not among the failures at all: torchrun stops it with
    ``SIGTERM`` as soon as it sees the culprit, so this costs no time.

    Args:
        exc: The exception this rank is failing with; nothing happens unless it is a
            victim's (:func:`is_peer_failure`) under torchrun.
    """
    if not os.environ.get("TORCHELASTIC_RUN_ID") or not is_peer_failure(exc):
        return
    if id(exc) in _waited:
        return
    _waited.add(id(exc))
    time.sleep(VICTIM_GRACE_S)


def record_failure(exc: BaseException, *, now: float | None = None) -> bool:
    """Write ``exc`` as this rank's torchrun error record (``TORCHELASTIC_ERROR_FILE``).

    torchrun names as "Root Cause" the failed rank whose record has the smallest timestamp,
    in whole seconds, the lowest rank winning a tie: a victim (rank 0, whose all-reduce saw
    the connection close) failing in the same second as the rank that raised would be named,
    and a SIGKILLed rank (no record) is dated when torchrun notices it, up to a second later.
    So a victim's record (:func:`is_peer_failure`) is dated :data:`VICTIM_DELAY_S` seconds
    later (torchrun's report shows that time), and holds two lines instead of a traceback.
    The record of one exception is written with one timestamp, however often this is called
    (the first call, from teardown, dates it).

    Args:
        exc: The exception.
        now: The time of the failure (default: now).

    Returns:
        True if a record was written (torchrun set ``TORCHELASTIC_ERROR_FILE``).
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return False
    victim = is_peer_failure(exc)
    stamp = _recorded.get(id(exc))
    if stamp is None:
        stamp = int(time.time() if now is None else now) + (VICTIM_DELAY_S if victim else 0)
        _recorded[id(exc)] = stamp
    message = f"{type(exc).__name__}: {exc}"
    if victim:  # two lines in torchrun's report: the traceback to read is the root cause's
        callstack = f"rank {_rank()} stopped: another rank failed first\n{message}\n"
    else:
        callstack = "".join(traceback.format_exception(exc))
    data = {
        "message": {
            "message": message,
            "extraInfo": {"py_callstack": callstack, "timestamp": str(stamp)},
        }
    }
    return write_error_record(path, data)


def write_error_record(path: str, data: object) -> bool:
    """Write torchrun's error record ``path`` atomically (a temporary file, then a rename).

    torchrun reads a failed rank's record as soon as the process is gone; a rank killed
    while writing it in place (torchrun's own SIGTERM) left an empty file, on which torchrun
    itself crashed with a ``JSONDecodeError`` (measured in the fault matrix).

    Args:
        path: The record's path (``TORCHELASTIC_ERROR_FILE``).
        data: The JSON document.

    Returns:
        True if it was written.
    """
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as handle:
            json.dump(data, handle)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    return True


def _print_traceback(exc: BaseException) -> None:
    """``exc``'s traceback on stderr, each line prefixed ``[rankR]:`` like torch's own hook."""
    text = "".join(traceback.format_exception(exc)).rstrip("\n")
    prefix = f"[rank{_rank()}]: "
    with contextlib.suppress(Exception):
        sys.stderr.write("".join(prefix + line + "\n" for line in text.split("\n")))


def exit_now(code: int) -> NoReturn:
    """End this process at once with ``code``: children stopped, output flushed, no shutdown.

    ``os._exit`` skips interpreter shutdown, where gloo can hang or abort (docs/design.md, "Traps"). It
    also skips the DataLoader's own clean-up, and torchrun signals only the ranks still
    alive, so a worker process stuck in ``__getitem__`` would outlive its rank (holding the
    job's output open): the children of this process are killed first.

    Args:
        code: The exit status.
    """
    import multiprocessing

    with contextlib.suppress(Exception):
        for child in multiprocessing.active_children():
            child.kill()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def report_and_exit(exc: BaseException, why: str, code: int = 1) -> NoReturn:
    """Record ``exc``, print its traceback and ``why`` on stderr, and ``os._exit(code)``.

    Args:
        exc: The exception to report.
        why: One line saying why the process ends here.
        code: The exit status.
    """
    record_failure(exc)
    _print_traceback(exc)
    with contextlib.suppress(Exception):
        sys.stderr.write(f"gpu-training: rank {_rank()}: {why}\n")
    exit_now(code)


def end_failed_rank(exc: BaseException, code: int = 1) -> NoReturn:
    """End a failed rank of a multi-rank job at once, its exception on record.

    The rank that failed first prints its traceback; a victim (:func:`is_peer_failure`) prints
    nothing more than the line it has already printed, so the output names the culprit once.
    ``os._exit`` then skips interpreter shutdown: there gloo frees the process group, and with
    a DDP model still referenced by the traceback that can hang or abort (docs/design.md, "Traps").
    Call it only where nothing else must run before the process ends.

    Args:
        exc: The exception the rank failed with.
        code: The exit status.
    """
    record_failure(exc)
    if not is_peer_failure(exc):
        _print_traceback(exc)
    let_culprit_be_seen(exc)
    exit_now(code)


@contextlib.contextmanager
def exit_if_stuck(exc: BaseException, timeout: float = FAILED_TEARDOWN_TIMEOUT_S) -> Iterator[None]:
    """Run the block (a failed rank's teardown); if it is still running after ``timeout``
    seconds, report ``exc`` and end the process (:func:`report_and_exit`).

    The deadline is a daemon thread: the block may hold native locks, but the blocking
    teardown calls of torch release the GIL (a Python thread ran throughout a blocked
    ``destroy_process_group()``).

    Args:
        exc: The exception the rank is failing with.
        timeout: Seconds the block may take.

    Example:
        >>> with exit_if_stuck(RuntimeError("boom"), timeout=5.0):
        ...     pass  # quick: nothing happens
    """
    done = threading.Event()

    def deadline() -> None:
        if not done.wait(timeout):
            report_and_exit(
                exc,
                f"failed ({type(exc).__name__}), and tearing down its process group took more "
                f"than {timeout:g}s (a peer is still in a collective): exiting now",
            )

    watcher = threading.Thread(target=deadline, name="gpu-training-teardown", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
