"""Hangs that name the rank: entry points that report the rank that failed, a debug mode that
turns a collective mismatch into an error in under a second, and a stall watchdog.

The silent hang of distributed training has two causes: one rank raised (the others wait
forever in their next collective), or the ranks called different collectives. Three tools:

* :func:`entry_point` — wrap ``main`` with it. It writes torchrun's error record (what
  torchelastic's ``record`` does), so ``torchrun`` reports the rank that raised, with its
  traceback, instead of the rank it had to kill (benchmarks/README.md, "Traps"), and it
  switches debug mode on when ``GPU_TRAINING_DEBUG=1``.
* :func:`enable_debug_mode` — ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` before the process group is
  created: every collective is fingerprinted first, and a mismatch (``all_reduce`` on one rank,
  ``broadcast`` on another) raises on both ranks, naming both, in well under a second instead
  of hanging until the 30-minute timeout. :func:`monitored_barrier` names the ranks that do not
  arrive (gloo's ``monitored_barrier``; a gloo side group under NCCL).
* :class:`StallWatchdog` — ``tick()`` it every step; after ``timeout`` seconds without a tick
  it dumps this process's Python stacks (faulthandler) to the log, compares notes with the
  other ranks through the job's rendezvous store (which rank is busy in its own code, which
  are waiting in which collective), prints a verdict naming the stalled rank(s), writes it as
  torchrun's error record and exits with :data:`EXIT_STALLED`. What each rank notes and how
  the verdict is reached: :mod:`~gpu_training.stall_report`.

Example:
    >>> import time
    >>> seen = []
    >>> with StallWatchdog(0.3, exit=False, on_stall=seen.append, quiet=True) as watchdog:
    ...     for step in range(3):
    ...         watchdog.tick(step)
    ...     time.sleep(0.8)          # no progress: the watchdog fires once
    >>> seen[0].culprits, seen[0].last_step
    ([0], 2)
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import io
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, MutableMapping
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO, TypeVar

from gpu_training import flight_recorder
from gpu_training.failure import (
    exception_in_flight,
    exit_now,
    is_peer_failure,
    one_line,
    record_failure,
)
from gpu_training.stall_report import (
    StallReport,
    collect_states,
    frame_state,
    publish_state,
    raised_state,
    record_stall_error,
    stall_verdict,
)

__all__ = [
    "DEBUG_ENV",
    "EXIT_STALLED",
    "STALL_TIMEOUT_ENV",
    "StallError",
    "StallReport",
    "StallWatchdog",
    "barrier",
    "debug_mode_enabled",
    "enable_debug_mode",
    "entry_point",
    "monitored_barrier",
]

EXIT_STALLED = 124
"""Exit status of a process the watchdog ends (like ``timeout(1)``)."""

DEBUG_ENV = "GPU_TRAINING_DEBUG"
"""Set to 1 to turn on debug mode in processes started through :func:`entry_point`."""

STALL_TIMEOUT_ENV = "GPU_TRAINING_STALL_TIMEOUT"
"""Seconds without step progress before :meth:`StallWatchdog.from_env`'s watchdog fires."""

_TRUE = frozenset({"1", "true", "yes", "on"})
_F = TypeVar("_F", bound=Callable[..., Any])
_STORE_PREFIX = "gpu_training/watchdog"


class StallError(RuntimeError):
    """Ranks did not arrive at a monitored barrier in time; the message names them."""


# --- debug mode -------------------------------------------------------------------------------


def debug_mode_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether debug mode is requested (``GPU_TRAINING_DEBUG=1`` or
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL``).

    Example:
        >>> debug_mode_enabled({"GPU_TRAINING_DEBUG": "1"}), debug_mode_enabled({})
        (True, False)
    """
    env = os.environ if env is None else env
    return (
        env.get(DEBUG_ENV, "").strip().lower() in _TRUE
        or env.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL"
    )


def enable_debug_mode(env: MutableMapping[str, str] | None = None) -> dict[str, str | None]:
    """Turn on collective fingerprinting and the other distributed debug aids.

    Sets ``GPU_TRAINING_DEBUG=1`` and ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (each collective is
    checked against the other ranks' before it runs: a mismatch raises on every rank, naming
    the ranks and the operations), ``TORCH_SHOW_CPP_STACKTRACES=1`` and, unless already set,
    ``NCCL_DEBUG=WARN``. Call it before the process group is created (child processes inherit
    the variables); in this process torch's debug level is updated too. The fingerprint
    compares the collectives of one process group (DeepSpeed's own groups are not compared
    with the default one: pair it with the :class:`StallWatchdog`). On gloo, create the
    group with :func:`gpu_training.ddp.init_distributed`: DDP otherwise segfaults under DETAIL
    on torch 2.13.

    Args:
        env: The environment to change (default ``os.environ``).

    Returns:
        The previous values (None: unset), to restore them.

    Example:
        >>> env = {}
        >>> enable_debug_mode(env)["TORCH_DISTRIBUTED_DEBUG"] is None
        True
        >>> env["TORCH_DISTRIBUTED_DEBUG"]
        'DETAIL'
    """
    target = os.environ if env is None else env
    wanted = {
        DEBUG_ENV: "1",
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        "TORCH_SHOW_CPP_STACKTRACES": "1",
        "NCCL_DEBUG": target.get("NCCL_DEBUG") or "WARN",
    }
    previous = {key: target.get(key) for key in wanted}
    target.update(wanted)
    if target is os.environ and "torch.distributed" in sys.modules:
        import torch.distributed as dist

        # The level is read once at import; groups created from now on get the wrapper.
        dist.set_debug_level_from_env()  # type: ignore[attr-defined, unused-ignore]
    return previous


def _distributed_ready() -> bool:
    if "torch.distributed" not in sys.modules:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


_side_group: Any = None


def monitored_barrier(timeout: float = 60.0, *, wait_all_ranks: bool = True) -> None:
    """A barrier that names the ranks that did not arrive within ``timeout`` seconds.

    Every rank calls it. gloo's ``monitored_barrier`` is used directly; under NCCL a gloo side
    group is created on first use (a collective too). No-op without a process group.

    Args:
        timeout: Seconds to wait for the other ranks.
        wait_all_ranks: Report every missing rank, not only the first.

    Raises:
        StallError: On rank 0 (and, once their own wait times out, on the others) when ranks
            are missing; the message names them.
    """
    global _side_group
    if not _distributed_ready():
        return
    import torch.distributed as dist

    group = None
    if dist.get_backend() != "gloo":
        if _side_group is None:
            _side_group = dist.new_group(backend="gloo")
        group = _side_group
    try:
        dist.monitored_barrier(
            group=group, timeout=timedelta(seconds=timeout), wait_all_ranks=wait_all_ranks
        )
    except RuntimeError as err:
        message = " ".join(str(err).split())
        raise StallError(
            f"monitored_barrier on rank {dist.get_rank()}: not every rank arrived within "
            f"{timeout:g}s: {message}"
        ) from err


def barrier(timeout: float = 300.0) -> None:
    """``dist.barrier()``, or :func:`monitored_barrier` in debug mode (no-op in one process).

    A no-op too while an exception is in flight (a failing rank's ``finally:``): the other
    ranks wait in another collective and would never arrive.

    Args:
        timeout: The monitored barrier's wait in debug mode.
    """
    if not _distributed_ready() or exception_in_flight() is not None:
        return
    if debug_mode_enabled():
        monitored_barrier(timeout)
        return
    import torch.distributed as dist

    dist.barrier()


# --- entry points -----------------------------------------------------------------------------


def entry_point(fn: _F) -> _F:
    """Decorate a distributed program's ``main``: the rank that fails is the one reported.

    * torchrun's error record, as torchelastic's ``record`` writes it (the exception and its
      traceback in ``TORCHELASTIC_ERROR_FILE``; faulthandler on), so torchrun's summary names
      the rank that raised, not the rank it killed afterwards, and shows its traceback. It is
      written atomically (:func:`gpu_training.failure.record_failure`): ``record`` writes in
      place, and a rank that torchrun stopped mid-write left an empty file on which torchrun
      itself crashed. A rank that only saw a peer go away (gloo's ``Connection closed by
      peer``) is post-dated, so torchrun's "Root Cause" is never that victim;
    * a one-line ``gpu-training: rank R failed: ...`` on stderr, for launches without torchrun
      (``rank R stopped: another rank failed first (...)`` for such a victim);
    * debug mode (:func:`enable_debug_mode`) when ``GPU_TRAINING_DEBUG=1``, before ``main``
      creates its process group.

    Args:
        fn: The entry point.

    Returns:
        The wrapped function.

    Example:
        >>> @entry_point
        ... def main() -> int:
        ...     return 0
        >>> main()
        0
    """
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if debug_mode_enabled():
            enable_debug_mode()
        ErrorHandler().initialize()  # faulthandler, as torchelastic's record does
        try:
            return fn(*args, **kwargs)
        except (Exception, KeyboardInterrupt) as exc:
            record_failure(exc)
            rank = os.environ.get("RANK")
            if rank is not None:
                what = one_line(exc)
                if is_peer_failure(exc):
                    line = f"gpu-training: rank {rank} stopped: another rank failed first ({what})"
                else:
                    line = f"gpu-training: rank {rank} failed: {what}"
                print(line, file=sys.stderr, flush=True)
            raise

    return wrapper  # type: ignore[return-value]


# --- the stall watchdog -----------------------------------------------------------------------


class StallWatchdog:
    """Ends a run that makes no step progress for ``timeout`` seconds, naming the stalled rank.

    Call :meth:`tick` once per step (cheap: it stores a time). A background thread checks
    every ``poll`` seconds; when the limit passes it:

    1. classifies where this rank's main thread is (busy in the program's code, waiting in a
       collective, in backward) and publishes it in the rendezvous store;
    2. dumps every Python thread's stack of this process to ``stream`` (faulthandler);
    3. waits up to ``grace`` seconds for the other ranks' notes — their watchdogs fire at
       about the same time, since a rank waiting on a stalled one stops ticking too;
    4. prints the verdict (which ranks are stalled and where, which wait in which collective),
       records it as torchrun's error for this rank (stalled ranks first, so torchrun's "root
       cause" is the stalled rank) and exits with :data:`EXIT_STALLED` (``exit=True``) or calls
       ``on_stall``.

    Args:
        timeout: Seconds without a tick before firing; None or <= 0 disables the watchdog.
        ctx: This process's context (default: from the environment).
        startup_timeout: The limit before the first tick (compilation, data loading);
            default ``timeout``.
        grace: Seconds to wait for the other ranks' notes.
        stream: Where the report and stacks go (default: ``sys.stderr`` when it fires).
        quiet: Write nothing (the report still goes to ``on_stall`` and torchrun's record).
        exit: End the process (``os._exit(EXIT_STALLED)``) after reporting.
        on_stall: Called with the :class:`StallReport` (before exiting, if ``exit``).
        poll: Seconds between checks (default ``min(1, timeout / 10)``).
        dump_dir: Where each rank writes its flight-recorder buffer when the watchdog fires
            (``DIR/flight_recorder/rankR.json``; the Trainer passes its output directory).
            The ranks' last collectives are compared in the verdict either way
            (:mod:`~gpu_training.flight_recorder`), when the recorder was on.

    Raises:
        ValueError: If ``grace`` or ``poll`` is negative.
    """

    def __init__(
        self,
        timeout: float | None,
        *,
        ctx: Any = None,
        startup_timeout: float | None = None,
        grace: float = 2.0,
        stream: TextIO | None = None,
        quiet: bool = False,
        exit: bool = True,
        on_stall: Callable[[StallReport], None] | None = None,
        poll: float | None = None,
        dump_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if grace < 0 or (poll is not None and poll <= 0):
            raise ValueError(f"grace must be >= 0 and poll > 0, got {grace} and {poll}")
        self.timeout = timeout if timeout is not None and timeout > 0 else None
        self.startup_timeout = startup_timeout if startup_timeout is not None else self.timeout
        self.grace = grace
        self.stream = stream
        self.quiet = quiet
        self.exit = exit
        self.on_stall = on_stall
        self.poll = poll if poll is not None else min(1.0, (self.timeout or 10.0) / 10)
        self.dump_dir = dump_dir
        self._ctx = ctx
        self._last = time.monotonic()
        self._step: int | None = None
        self._ticked = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watched: int | None = None
        self.report: StallReport | None = None

    @classmethod
    def from_env(cls, ctx: Any = None, **kwargs: Any) -> StallWatchdog:
        """A watchdog with ``GPU_TRAINING_STALL_TIMEOUT`` seconds (disabled when unset or 0).

        Args:
            ctx: This process's context.
            **kwargs: Other :class:`StallWatchdog` arguments.

        Raises:
            ValueError: If the variable is not a number.
        """
        raw = os.environ.get(STALL_TIMEOUT_ENV, "").strip()
        try:
            timeout = float(raw) if raw else None
        except ValueError:
            raise ValueError(
                f"environment variable {STALL_TIMEOUT_ENV} must be a number of seconds, got {raw!r}"
            ) from None
        return cls(timeout, ctx=ctx, **kwargs)

    @property
    def enabled(self) -> bool:
        """False when constructed without a timeout: then every method is a no-op."""
        return self.timeout is not None

    def start(self) -> StallWatchdog:
        """Start watching the calling thread (the training loop's)."""
        if not self.enabled or self._thread is not None:
            return self
        self._watched = threading.get_ident()
        self._last = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-training-watchdog", daemon=True)
        self._thread.start()
        return self

    def tick(self, step: int | None = None) -> None:
        """Record progress (call once per step, on every rank)."""
        self._last = time.monotonic()
        self._step = step if step is not None else (self._step or 0) + 1
        self._ticked = True

    def stop(self) -> None:
        """Stop watching (idempotent)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def __enter__(self) -> StallWatchdog:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        watching = self._thread is not None
        self.stop()
        if watching and isinstance(exc, Exception):
            self._note_raised(exc)

    def _note_raised(self, exc: BaseException) -> None:
        """Leave a "raised" note for the other ranks' watchdogs, and torchrun's record.

        A rank whose loop raised stops ticking like a stalled one; without the note, the
        others' verdict would call it stuck, or silent once it is gone.
        """
        rank, _ = self._context()
        record_failure(exc)  # before any teardown, in which the rank may be killed
        if is_peer_failure(exc):
            return  # a victim: the note of the rank that failed first is the one to read
        state = {**raised_state(exc, skip_file=__file__), "step": self._step}
        publish_state(_store(), f"{_key()}/rank{rank}", state)

    # --- firing ----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            limit = self.timeout if self._ticked else self.startup_timeout
            idle = time.monotonic() - self._last
            if limit is not None and idle > limit:
                self._fire(idle)
                return

    def _context(self) -> tuple[int, int]:
        ctx = self._ctx
        if ctx is None:
            rank = int(os.environ.get("RANK", "0") or 0)
            world = int(os.environ.get("WORLD_SIZE", "1") or 1)
            return rank, world
        return int(ctx.rank), int(ctx.world_size)

    def _fire(self, idle: float) -> None:
        rank, world = self._context()
        frame = sys._current_frames().get(self._watched or 0)
        state = {**frame_state(frame, skip_file=__file__), "step": self._step}
        dump = flight_recorder.snapshot() if world > 1 else None
        if dump is not None:
            state["collectives"] = flight_recorder.summarize(dump)
            if self.dump_dir is not None:
                with contextlib.suppress(OSError):  # a full disk must not hide the verdict
                    flight_recorder.write_dump(self.dump_dir, rank, dump)
        store = _store()
        key = _key()
        publish_state(store, f"{key}/rank{rank}", state)
        self._write(
            f"gpu-training watchdog: rank {rank} made no step progress for {idle:.1f}s "
            f"(last step {self._step}); {state['state']} at {state['where']}. Python stacks of "
            f"rank {rank}:\n"
        )
        self._dump_stacks()
        states = {rank: state}
        if world > 1 and store is not None:
            states = collect_states(store, key, world, self.grace) or states
        limit = self.timeout if self._ticked else self.startup_timeout
        culprits, verdict = stall_verdict(states, world, limit or idle)
        report = StallReport(rank, idle, self._step, dict(states), culprits, "")
        report.message = f"stall detected by rank {rank}: {verdict}"
        self.report = report
        self._write(f"gpu-training watchdog: {report.message}\n")
        if self.dump_dir is not None:  # for `gpu-training report`
            with contextlib.suppress(OSError):
                folder = Path(self.dump_dir) / "flight_recorder"
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"verdict-rank{rank}.txt").write_text(report.message + "\n")
        record_stall_error(report, first=rank in culprits or not culprits)
        if self.on_stall is not None:
            self.on_stall(report)
        if self.exit:
            if rank not in culprits and culprits:
                time.sleep(0.5)  # let the stalled rank's record be torchrun's root cause
            exit_now(EXIT_STALLED)  # its DataLoader workers too: torchrun will not stop them

    def _out(self) -> TextIO | None:
        return None if self.quiet else (self.stream or sys.stderr)

    def _write(self, text: str) -> None:
        stream = self._out()
        if stream is None:
            return
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            pass

    def _dump_stacks(self) -> None:
        stream = self._out()
        if stream is None:
            return
        try:
            stream.flush()
            fileno = stream.fileno()
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            fileno = -1
        if fileno >= 0:
            faulthandler.dump_traceback(file=fileno, all_threads=True)
            return
        for ident, frame in sys._current_frames().items():
            self._write(f"Thread {ident:#x}:\n" + "".join(traceback.format_stack(frame)))


def _key() -> str:
    """The store prefix of this attempt's notes (a restarted group starts afresh)."""
    return f"{_STORE_PREFIX}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def _store() -> Any:
    """The job's rendezvous store, or None without a process group."""
    if not _distributed_ready():
        return None
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:  # a private helper: without it the report is this rank's only
        return None
