"""Run torchrun to the end: signals forwarded to the workers, no orphans, the job's exit code.

:func:`run_torchrun` is what ``gpu-training launch`` (and ``gpu-training train --nproc N``)
use to start torchrun. It imports no torch.

Example:
    >>> import sys
    >>> from gpu_training.launcher import run_torchrun
    >>> run_torchrun([sys.executable, "-c", "raise SystemExit(3)"])  # the job's exit code
    3
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from types import FrameType

__all__ = [
    "EXIT_STOPPED",
    "FORWARDED_SIGNALS",
    "QUIET_TORCHRUN",
    "Janitor",
    "own_log_dir",
    "run_torchrun",
]

FORWARDED_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
)
"""Signals :func:`run_torchrun` passes on to torchrun (which passes them on to every worker)."""

EXIT_STOPPED = 128 + signal.SIGTERM  # 143
"""The job's exit code when one of :data:`FORWARDED_SIGNALS` stopped it, whichever process
received it (``gpu_training.preemption.EXIT_PREEMPTED``: stopped on request, requeue me)."""

QUIET_TORCHRUN: tuple[str, ...] = (sys.executable, "-m", "gpu_training.launcher.torchrun")
"""torchrun through :mod:`gpu_training.launcher.torchrun`: the same torchrun, quiet ending."""

OWNED_LOG_DIR_ENV = "GPU_TRAINING_TORCHRUN_LOG_DIR"
"""Set by :func:`run_torchrun` to the log directory it made; torchrun's wrapper removes it."""

_TORCHRUN_MODULE = (sys.executable, "-m", "torch.distributed.run")
_LOG_DIR_FLAGS = ("--log-dir", "--log_dir")


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    prctl, parent = libc.prctl, os.getpid()  # resolved before fork: the child only calls

    def preexec() -> None:
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl: nobody will tell us
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every process (Linux /proc; empty elsewhere)."""
    table: dict[int, tuple[int, str]] = {}
    if not os.path.isdir("/proc"):
        return table
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":  # a zombie has already exited
            table[int(entry)] = (int(fields[1]), fields[19])
    return table


def _descendants(pid: int, table: Mapping[int, tuple[int, str]]) -> dict[int, str]:
    """The live descendants of ``pid`` in ``table``: pid -> start time."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = table[child][1]
            todo.append(child)
    return found


def _stop_leftovers(tracked: Mapping[int, str], timeout: float) -> list[int]:
    """SIGTERM, then after ``timeout`` s SIGKILL, the tracked processes still alive."""
    table = _proc_table()
    # Same pid *and* start time: a recycled pid is not ours to kill.
    alive = [pid for pid, start in tracked.items() if table.get(pid, (0, ""))[1] == start]
    if not alive:
        return []
    print(
        f"gpu-training: torchrun is gone but {len(alive)} worker process(es) are not: "
        f"sending SIGTERM (SIGKILL after {timeout:.0f} s) to {alive}",
        file=sys.stderr,
    )
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        for pid in alive:
            try:
                # torchrun starts each worker as a session leader: signal its whole group.
                if os.getpgid(pid) == pid:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                continue
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            table = _proc_table()
            alive = [p for p in alive if table.get(p, (0, ""))[1] == tracked[p]]
            if not alive:
                return []
            time.sleep(0.1)
    return alive


def _job_exit_code(returncode: int, forwarded: Sequence[int]) -> int:
    """torchrun's exit code, as a shell reports it; :data:`EXIT_STOPPED` after a stop signal.

    A bare torchrun exits 1 whenever it was signalled, so a preempted job (workers saved and
    exited with 143) would look like a crash; one code for every forwarded signal (not
    128 + N) lets a requeue script test a single value. torchrun itself killed by a signal
    (SIGKILL, the OOM killer) is 128 + N: that job did not stop cleanly.
    """
    if returncode < 0:
        return 128 - returncode
    if returncode != 0 and forwarded:
        return EXIT_STOPPED
    return returncode


def _quiet(argv: Sequence[str]) -> list[str]:
    """``argv`` with this interpreter's ``-m torch.distributed.run`` run as :data:`QUIET_TORCHRUN`."""
    command = list(argv)
    if tuple(command[: len(_TORCHRUN_MODULE)]) == _TORCHRUN_MODULE:
        return [*QUIET_TORCHRUN, *command[len(_TORCHRUN_MODULE) :]]
    return command


def own_log_dir(argv: Sequence[str], env: MutableMapping[str, str]) -> str | None:
    """Give torchrun a log directory of ours (None when the caller chose one).

    Without ``--log-dir`` torchrun keeps its workers' error files in a fresh
    ``/tmp/torchelastic_*`` directory that nobody removes (13 left by six minutes of tests).
    """
    if "PET_LOG_DIR" in env or any(a.split("=", 1)[0] in _LOG_DIR_FLAGS for a in argv):
        return None
    directory = tempfile.mkdtemp(prefix="gpu-training-torchrun-")
    env["PET_LOG_DIR"] = directory  # torchrun reads each flag's PET_* variable too
    env[OWNED_LOG_DIR_ENV] = directory  # QUIET_TORCHRUN removes it too, if we are killed
    return directory


def run_torchrun(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    shutdown_timeout: float = 30.0,
    cwd: str | os.PathLike[str] | None = None,
) -> int:
    """Run a torchrun command line to the end and return the job's exit code.

    What it adds to a bare ``subprocess.run(argv)``:

    * **Signals are forwarded.** ``SIGTERM``, ``SIGINT``, ``SIGHUP``, ``SIGQUIT`` and
      ``SIGUSR1`` received by this process are sent to torchrun, which sends them to every
      worker (given ``--signals-to-handle``, which
      :func:`~gpu_training.launcher.launch_argv` adds); workers using
      :class:`~gpu_training.preemption.PreemptionHandler` save and exit. torchrun runs in a
      session of its own, so a Ctrl-C at the terminal reaches it once, through here.
    * **No orphans.** torchrun gets ``SIGTERM`` if this process dies, even by ``SIGKILL``
      (Linux ``PR_SET_PDEATHSIG``), and passes it on. If torchrun itself dies without
      stopping its workers (``SIGKILL``, OOM killer) they would live on, each in its own
      session: the workers seen while the job ran are then sent ``SIGTERM`` and, after
      ``shutdown_timeout`` seconds, ``SIGKILL``.
    * **The exit code is the job's**: torchrun's code (0, or 1 when a worker failed after
      all restarts), or :data:`EXIT_STOPPED` (143, the
      :data:`~gpu_training.preemption.EXIT_PREEMPTED` convention: requeue me) when one of
      :data:`FORWARDED_SIGNALS` stopped the job, whichever process received it; 128 + N when
      torchrun itself was killed by signal N.
    * **A quiet end.** ``python -m torch.distributed.run`` with this interpreter runs as
      :data:`QUIET_TORCHRUN` (the same torchrun, same flags): a signal stop ends without
      torchrun's ``SignalException`` traceback, a worker failure with torchrun's report
      (the root-cause rank and its traceback) as the last block.
    * **Nothing left in /tmp.** Unless ``--log-dir`` (or ``PET_LOG_DIR``) is given, torchrun's
      logs and error files go to a temporary directory removed when the job ends.

    Signal handlers are installed only when called from the main thread (Python delivers
    signals there), and the previous ones are restored on return.

    Args:
        argv: The command, e.g. from :func:`~gpu_training.launcher.launch_argv` with
            ``program=(sys.executable, "-m", "torch.distributed.run")``.
        env: Its environment (see :func:`~gpu_training.launcher.launch_env`); ``None``
            inherits this one.
        shutdown_timeout: Seconds leftover workers get between ``SIGTERM`` and ``SIGKILL``.
        cwd: Working directory of torchrun.

    Returns:
        The job's exit code (see above).

    Raises:
        OSError: If the program cannot be started (e.g. ``torchrun`` is not on ``PATH``).

    Example:
        >>> import sys
        >>> from gpu_training.launcher import launch_argv, launch_env
        >>> here = (sys.executable, "-m", "torch.distributed.run")  # this Python's torchrun
        >>> argv = launch_argv("train.py", 2, program=here)
        >>> run_torchrun(argv, launch_env(nproc_per_node=2))  # doctest: +SKIP
        0
    """
    forwarded: list[int] = []
    started: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        forwarded.append(signum)
        if started and started[0].poll() is None:
            started[0].send_signal(signum)  # torchrun passes it on to every worker

    previous: dict[signal.Signals, object] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    tracked: dict[int, str] = {}
    command = _quiet(argv)
    child_env = dict(os.environ if env is None else env)
    log_dir = own_log_dir(command, child_env)
    try:
        proc = subprocess.Popen(
            command,
            env=child_env,
            cwd=cwd,
            start_new_session=True,  # terminal signals reach it through us, once
            preexec_fn=_die_with_parent(),
        )
        started.append(proc)
        if forwarded:  # a signal came before torchrun existed
            proc.send_signal(forwarded[-1])
        while True:
            try:
                returncode = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                # Remember the workers: if torchrun dies abruptly, they must not live on.
                tracked.update(_descendants(proc.pid, _proc_table()))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        if started and started[0].poll() is None:  # we are failing: take torchrun down too
            started[0].terminate()
            try:
                started[0].wait(timeout=shutdown_timeout)
            except subprocess.TimeoutExpired:
                started[0].kill()
                started[0].wait()
        _stop_leftovers(tracked, shutdown_timeout)
        if log_dir is not None:
            shutil.rmtree(log_dir, ignore_errors=True)
    return _job_exit_code(returncode, forwarded)


class Janitor:
    """What :func:`run_torchrun` does for a torchrun child, for torchrun's agent in this process.

    ``gpu-training train --nproc N`` runs the agent in its own process (it has imported torch
    for its checks: a torchrun child would be one more interpreter and torch import). If that
    process is killed (``SIGKILL``, the OOM killer), nobody is left to stop the workers, each
    in a session of its own, or to remove torchrun's log directory. A janitor is a small
    torch-free child (:func:`janitor_main`) that watches this process through a pipe and
    notes its descendants (every 0.2 s for a minute, then every 2 s). When the pipe closes
    without a word (this process died), it sends the workers still alive ``SIGTERM`` (they
    save and stop) and, ``shutdown_timeout`` seconds later, ``SIGKILL``, as
    :func:`run_torchrun` does when torchrun dies; then it removes ``log_dir``. :meth:`close`
    ends it on a normal end.

    Example:
        >>> with Janitor(log_dir=None) as janitor:
        ...     janitor.pid > 0
        True
    """

    _DONE = b"x"
    """Written by :meth:`close`: the job ended here (a closed pipe alone: this process died)."""

    def __init__(self, log_dir: str | None, *, shutdown_timeout: float = 30.0) -> None:
        """Start the janitor for this process.

        Args:
            log_dir: A directory to remove after this process died (None: none).
            shutdown_timeout: Seconds leftover workers get between ``SIGTERM`` and ``SIGKILL``.
        """
        read_end, self._write_end = os.pipe()
        args = [str(os.getpid()), str(read_end), str(shutdown_timeout), log_dir or ""]
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _JANITOR, *args],
                pass_fds=(read_end,),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C at the terminal is for the agent
            )
        finally:
            os.close(read_end)

    @property
    def pid(self) -> int:
        """The janitor's process id."""
        return self._proc.pid

    def close(self) -> None:
        """End the janitor: the job ended here, nothing for it to stop or remove."""
        if self._write_end >= 0:
            with contextlib.suppress(OSError):
                os.write(self._write_end, self._DONE)
            os.close(self._write_end)
            self._write_end = -1
        try:
            self._proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> Janitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_JANITOR = (
    "import sys; from gpu_training.launcher.supervise import janitor_main as m; m(sys.argv[1:])"
)


def janitor_main(argv: Sequence[str]) -> int:
    """The janitor's loop (:class:`Janitor`): ``AGENT_PID READ_FD TIMEOUT LOG_DIR``.

    Returns 0 once the agent has written that the job ended, or after it died and the
    leftovers were stopped and its log directory (an empty ``LOG_DIR``: none) removed.
    """
    agent, fd, timeout, log_dir = int(argv[0]), int(argv[1]), float(argv[2]), argv[3]
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):  # the agent's, not ours
        signal.signal(sig, signal.SIG_IGN)
    tracked: dict[int, str] = {}
    started = time.monotonic()
    while True:
        # the workers start in the first seconds (train has no restarts): look often then only
        ready, _, _ = select.select([fd], [], [], 0.2 if time.monotonic() - started < 60 else 2.0)
        if ready:
            if os.read(fd, 1) == Janitor._DONE:
                return 0  # a normal end: the agent has stopped its workers itself
            break  # the pipe closed without a word: the agent died
        found = _descendants(agent, _proc_table())
        found.pop(os.getpid(), None)
        tracked.update(found)
    _stop_leftovers(tracked, timeout)
    if log_dir:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0
