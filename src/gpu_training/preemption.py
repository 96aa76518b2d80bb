"""Stop cleanly when the cluster takes the machines back: checkpoint, then exit with a known code.

Who sends what:

- **torchrun / Kubernetes**: ``SIGTERM``. Kubernetes sends it to the container on eviction or
  preemption, then ``SIGKILL`` after ``terminationGracePeriodSeconds`` (30 s by default);
  torchrun forwards a ``SIGTERM`` it receives to every worker and sends ``SIGKILL`` to those
  still alive after its own grace period (30 s).
- **SLURM**: ``sbatch --signal=USR1@90`` sends ``SIGUSR1`` 90 s before the time limit (use
  ``--signal=B:USR1@90`` to signal only the batch shell); at the limit, or on preemption,
  SLURM sends ``SIGTERM`` and, ``KillWait`` seconds later, ``SIGKILL``. Under torchrun, add
  ``--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1``: by default torchrun does
  not handle ``SIGUSR1``, dies of it and leaves its workers running as orphans.

A signal reaches a process at any point of a step, and not necessarily every rank (a node
that is taken back signals only its own processes). :class:`PreemptionHandler` only records
it; at the next step boundary :meth:`PreemptionHandler.should_stop`, called by every rank,
all-reduces the flag, so every rank stops after the *same* step, saves and exits::

    from gpu_training.checkpoint import CheckpointManager
    from gpu_training.preemption import PreemptionHandler, exit_preempted

    ckpt = CheckpointManager("checkpoints", ctx=ctx)
    with ckpt, PreemptionHandler(ctx=ctx) as preemption:
        for step in range(start, total_steps):
            train_step()
            if preemption.should_stop():       # every rank, every step: a collective
                ckpt.save(state(), step=step)  # every rank; rank 0 writes
                break
    if preemption.stopped:
        exit_preempted()                       # exit code EXIT_PREEMPTED: requeue me

A restarted job resumes from ``ckpt.load()``.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterable
from types import FrameType, TracebackType
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from gpu_training.ddp import DistributedContext, cleanup_distributed, process_group_up
from gpu_training.process_group import collective_device

__all__ = ["DEFAULT_SIGNALS", "EXIT_PREEMPTED", "PreemptionHandler", "exit_preempted"]

EXIT_PREEMPTED = 128 + signal.SIGTERM  # 143
"""Exit code of a process that stopped because it was asked to: 143 = 128 + SIGTERM.

It is the code the process would have had if it had not caught ``SIGTERM`` (what a shell,
``docker`` and Kubernetes report for a SIGTERM-killed process), so supervisors that already
treat "terminated by SIGTERM" as preemption keep working, with a checkpoint now written.
It is non-zero on purpose: exit code 0 would mark a Kubernetes Job or a SLURM job as
*completed* and nothing would resume it. A SLURM requeue wrapper checks for it::

    srun python train.py; rc=$?
    [ "$rc" -eq 143 ] && scontrol requeue "$SLURM_JOB_ID"

A bare ``torchrun`` exits with 1 whenever a worker failed or torchrun itself was signalled
(the workers' codes appear in its failure report, ``exitcode : 143``); ``gpu-training
launch`` and ``gpu-training train --nproc N`` exit with 143 whichever process got the signal
(:func:`gpu_training.launcher.run_torchrun`).
"""

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
)
"""Every signal ``gpu-training launch`` forwards: SIGTERM (torchrun, Kubernetes, SLURM at the
limit), SIGINT (Ctrl-C), SIGHUP (the terminal went away), SIGQUIT and SIGUSR1 (SLURM
``--signal``). A second SIGINT raises ``KeyboardInterrupt`` as usual: the way out of a step
that does not end."""


class PreemptionHandler:
    """Records termination signals and turns them into one stop decision shared by every rank.

    Install it with ``with``: the handlers are installed on entry and the previous ones
    restored on exit. The handler only sets a flag (nothing that could deadlock or corrupt
    state runs inside a signal handler); the training loop asks :meth:`should_stop` at a step
    boundary.

    Args:
        signals: The signals to catch.
        ctx: This process's rank identity; ``DistributedContext.from_env()`` when None.

    Raises:
        ValueError: If ``signals`` is empty or names ``SIGKILL``/``SIGSTOP`` (uncatchable).

    Example:
        >>> import os, signal
        >>> with PreemptionHandler(signals=(signal.SIGUSR1,)) as preemption:
        ...     os.kill(os.getpid(), signal.SIGUSR1)
        ...     preemption.should_stop()
        True
    """

    def __init__(
        self,
        signals: Iterable[signal.Signals | int] = DEFAULT_SIGNALS,
        ctx: DistributedContext | None = None,
    ) -> None:
        self.signals = tuple(signal.Signals(s) for s in signals)
        if not self.signals:
            raise ValueError("signals must name at least one signal, got none")
        uncatchable = {signal.SIGKILL, signal.SIGSTOP} & set(self.signals)
        if uncatchable:
            names = ", ".join(sorted(s.name for s in uncatchable))
            raise ValueError(f"signals: {names} cannot be caught")
        self.ctx = ctx if ctx is not None else DistributedContext.from_env()
        self.received: signal.Signals | None = None
        """The first signal this process received (None if none): local, not agreed."""
        self.stopped = False
        """True once :meth:`should_stop` returned True (on every rank alike)."""
        self._previous: dict[signal.Signals, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # only a flag: the interrupted code may hold locks, be mid-collective or mid-write
        if self.received is None:
            self.received = signal.Signals(signum)
        elif signum == signal.SIGINT:  # Ctrl-C again: the user will not wait for the step
            raise KeyboardInterrupt

    def install(self) -> None:
        """Installs the handlers (the ``with`` statement calls this).

        Raises:
            RuntimeError: When called outside the main thread (Python delivers signals there
                only), or when already installed.
        """
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("PreemptionHandler must be installed from the main thread")
        if self._previous:
            raise RuntimeError("PreemptionHandler is already installed")
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        """Restores the handlers that were there before :meth:`install`; idempotent."""
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            # None: a handler installed from C; the default is the closest we can restore
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def __enter__(self) -> PreemptionHandler:
        self.install()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstall()

    def should_stop(self) -> bool:
        """Whether any rank was signalled; the same answer on every rank.

        Call it at a step boundary, on every rank, the same number of times: in a
        distributed job it is a collective (one all-reduce MAX of a 1-element tensor, well under
        a millisecond on gloo: benchmarks/README.md), so a signal delivered to a single rank
        stops every rank after the same step. To pay it less often, call it every N steps,
        the same N on every rank. Once True it stays True (and sets :attr:`stopped`).

        Returns:
            True if this or any other rank has received one of the signals.
        """
        flag = self.received is not None or self.stopped
        if self.ctx.is_distributed and process_group_up():
            packed = torch.tensor([int(flag)], dtype=torch.int32, device=collective_device())
            dist.all_reduce(packed, op=dist.ReduceOp.MAX)
            flag = bool(packed.item())
        self.stopped = self.stopped or flag
        return flag

    def __repr__(self) -> str:
        names = ", ".join(s.name for s in self.signals)
        return (
            f"PreemptionHandler(signals=({names}), received={self.received}, rank={self.ctx.rank})"
        )


def exit_preempted() -> NoReturn:
    """Leaves the process group and exits with :data:`EXIT_PREEMPTED`.

    Call it on every rank after the preemption checkpoint was saved, and drop a DDP-wrapped
    model first (freeing its reducer after the group is gone can hang gloo at exit). It
    raises ``SystemExit``, so ``finally`` blocks and ``atexit`` handlers still run (a
    pending asynchronous checkpoint is completed).
    """
    cleanup_distributed()
    sys.exit(EXIT_PREEMPTED)
