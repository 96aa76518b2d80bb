"""Run N gloo ranks, a torchrun job or one Python process from a test, with a hard timeout.

Every multi-rank test goes through :func:`run_ranks`: each rank is a new process with the
environment torchrun would give it, the ranks share one process group so a hang ends with
one ``killpg``, and the verdict comes from the result files the ranks wrote, not their exit
codes (docs/design.md, "Traps": ~3% of healthy 2-rank gloo runs abort at interpreter exit).

The ranks are forked from a *zygote*, a forkserver that imported torch and the package once
per test session (importing them is most of a fresh rank's start-up), not started as fresh
interpreters: each child sets its rank's environment, sends its output to its log, runs the
function and ends as an interpreter would (threads joined, ``atexit`` handlers run). A test
that needs a fresh interpreter per rank passes ``fresh=True``; ``GT_TEST_FRESH_RANKS=1``
makes every call do so.

Example:
    >>> def _worker(scale: float) -> float:  # module level in a test module
    ...     ctx = init_distributed()
    ...     ...
    >>> results = run_ranks(_worker, 2, args=(0.5,), timeout=60)
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from subprocess import STDOUT, Popen
from typing import Any

__all__ = [
    "REPO_ROOT",
    "TESTS_DIR",
    "ZYGOTE_PRELOAD",
    "find_free_port",
    "run_python",
    "run_ranks",
    "run_script",
    "zygote",
]

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
_WORKER = TESTS_DIR / "_rank_worker.py"
_LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")
_FAIL_FAST_GRACE_S = 3.0  # once one rank failed, the others get this long before being killed
_ADDR_IN_USE = ("address already in use", "eaddrinuse")
_EXIT_ABORT_TEXT = "terminate called without an active exception"
_FRESH_ENV = "GT_TEST_FRESH_RANKS"
_IMPORT_TIME_PREFIXES = ("TORCH_", "PYTORCH_", "OMP_", "MKL_", "GLOO_", "NCCL_")
ZYGOTE_PRELOAD = ("torch", "torch.distributed", "gpu_training.trainer", "dist_harness")
"""What the zygote imports once: torch, the package's modules a rank function uses."""


def find_free_port() -> int:
    """Returns a TCP port on 127.0.0.1 that was free a moment ago (the caller may still race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _base_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The parent environment without launcher variables, plus src/ and tests/ on PYTHONPATH."""
    out = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    out = {k: v for k, v in out.items() if not k.startswith(("MASTER_", "TORCHELASTIC_"))}
    paths = [str(REPO_ROOT / "src"), str(TESTS_DIR), *filter(None, [out.get("PYTHONPATH")])]
    out["PYTHONPATH"] = os.pathsep.join(paths)
    out["OMP_NUM_THREADS"] = "1"  # N ranks on 2 cores: oversubscribed OpenMP threads crawl
    if "GLOO_SOCKET_IFNAME" not in out and "lo" in {n for _, n in socket.if_nameindex()}:
        out["GLOO_SOCKET_IFNAME"] = "lo"  # keep gloo's own sockets on loopback too
    out.update(env or {})
    return out


def _descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _kill_tree(pids: Sequence[int]) -> None:
    """SIGKILLs ``pids``, their descendants and every process group they lead or joined.

    torchrun starts each worker in its own session, so killing torchrun's group alone
    would leave the workers running as orphans.
    """
    victims = [*pids, *(d for p in pids for d in _descendants(p))]
    own_group = os.getpgrp()
    for pid in victims:
        try:
            pgid = os.getpgid(pid)
            if pgid != own_group:
                os.killpg(pgid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue


def _tail(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else "[...]" + text[-limit:]


def _run_captured(
    cmd: list[str], timeout: float, env: Mapping[str, str] | None, cwd: str | Path | None
) -> subprocess.CompletedProcess[str]:
    """Runs ``cmd`` in a new session, captures text output, kills its whole tree on timeout."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_base_env(env),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree([proc.pid])
        try:  # bounded: a process that escaped the tree could hold the pipes open forever
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            out, err = "", "<output lost: a process outside the killed tree holds the pipes>"
        raise AssertionError(
            f"timed out after {timeout:.0f}s, process tree killed: {' '.join(cmd)}\n"
            f"--- stdout tail ---\n{_tail(out)}\n--- stderr tail ---\n{_tail(err)}"
        ) from None
    finally:
        if proc.poll() is None:  # KeyboardInterrupt or pytest-timeout while waiting
            _kill_tree([proc.pid])
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_python(
    args: Sequence[str],
    *,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs ``python ARGS`` (this interpreter) and returns its captured output.

    Args:
        args: Arguments after the interpreter, e.g. ``["-m", "gpu_training.cli", "plan"]``.
        timeout: Seconds before the process tree is SIGKILLed.
        env: Variables added to the hermetic base environment.
        cwd: Working directory.

    Returns:
        The completed process; the caller checks ``returncode``.

    Raises:
        AssertionError: On timeout, with the output tails.
    """
    return _run_captured([sys.executable, *args], timeout, env, cwd)


def run_script(
    script: str | Path,
    nprocs: int,
    args: Sequence[str] = (),
    *,
    timeout: float = 180.0,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs ``torchrun --standalone --nproc_per_node=NPROCS SCRIPT ARGS`` and captures output.

    Args:
        script: The training script.
        nprocs: Ranks to start (>= 1).
        args: Arguments passed to the script.
        timeout: Seconds before torchrun and all its workers are SIGKILLed.
        env: Variables added to the hermetic base environment.
        cwd: Working directory.

    Returns:
        The completed torchrun process; the caller checks ``returncode``.

    Raises:
        AssertionError: On timeout, with the output tails.
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    cmd = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nprocs}"]
    return run_python([*cmd, str(script), *args], timeout=timeout, env=env, cwd=cwd)


def _verdict(rank: int, rc: int, work: Path) -> str | None:
    """None if ``rank`` succeeded, else why not (first line: a one-line summary)."""
    err = work / f"rank{rank}.err"
    if err.exists():
        trace = err.read_text()
        return f"rank {rank} raised {trace.strip().splitlines()[-1]} (exit code {rc})\n{trace}"
    if not (work / f"rank{rank}.pkl").exists():
        return f"rank {rank} exited with code {rc} without writing a result"
    log = (work / f"rank{rank}.log").read_text(errors="replace")
    if rc == 0:
        return None
    if rc in (-signal.SIGABRT, -signal.SIGSEGV) or _EXIT_ABORT_TEXT in log:
        # the known gloo exit-time crash: the work was done and its result written
        warnings.warn(f"rank {rank} crashed at exit (code {rc}) after its result", stacklevel=4)
        return None
    return f"rank {rank} wrote its result but then exited with code {rc}"


def _group_kwargs(pgid: int) -> dict[str, Any]:
    """Popen arguments putting the child in process group ``pgid`` (0: a new group)."""
    if sys.version_info >= (3, 11):
        return {"process_group": pgid}
    return {"preexec_fn": lambda: os.setpgid(0, pgid)}  # pragma: no cover (Python 3.10)


# --- the zygote: ranks forked from a process that imported torch once -----------------------

_zygote_lock = threading.Lock()
_zygote_started = False


def zygote() -> multiprocessing.context.BaseContext:
    """The forkserver context, started on first use with :data:`ZYGOTE_PRELOAD` imported.

    Its processes are forks of one interpreter that imported torch and the package once; any
    test that starts many short-lived processes running our code should take them from it.
    """
    global _zygote_started
    ctx = multiprocessing.get_context("forkserver")
    with _zygote_lock:
        if _zygote_started:  # os.environ is swapped once, not under every later caller
            return ctx
        ctx.set_forkserver_preload(list(ZYGOTE_PRELOAD))
        saved = dict(os.environ)
        try:  # what torch reads at import time must be what every rank would see
            os.environ.clear()
            os.environ.update(_base_env(None))
            multiprocessing.forkserver.ensure_running()
            _zygote_started = True
        finally:
            os.environ.clear()
            os.environ.update(saved)
    return ctx


def _end_like_an_interpreter(code: int) -> None:
    """Join threads, run ``atexit`` handlers, flush, exit: a forked rank's interpreter exit."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, their atexit
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _forked_rank(payload: str, work: str, env: dict[str, str], pgid: int) -> None:
    """A rank in a zygote child: its group, its log, its environment, then the worker."""
    os.setpgid(0, pgid)  # 0: a group of its own (rank 0's, which the others join)
    rank = env["RANK"]
    fd = os.open(Path(work) / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):  # unbuffered: a killed rank's prints are in its log
        stream.reconfigure(line_buffering=True, write_through=True)  # type: ignore[attr-defined]
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [str(_WORKER), payload, work]
    import _rank_worker

    code = 1
    try:
        code = _rank_worker.main()
    finally:
        _end_like_an_interpreter(code)


class _Forked:
    """A zygote child with the part of ``Popen``'s interface the harness uses."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process
        self.pid = int(process.pid or 0)

    def poll(self) -> int | None:
        return self._process.exitcode

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def wait(self) -> int | None:
        self._process.join()
        return self._process.exitcode


def _join_group_of(pid: int, within: float = 10.0) -> None:
    """Waits until ``pid`` leads its own process group (a forked rank 0 sets it up first)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if os.getpgid(pid) == pid:
                return
        except ProcessLookupError:
            return  # rank 0 is gone already: its verdict says why
        time.sleep(0.002)


def _launch(
    payload: Path, nprocs: int, env: Mapping[str, str] | None, *, fresh: bool = False
) -> list[Any]:
    """Starts the ranks in one process group led by rank 0, output to ``rank{R}.log``."""
    base = {**_base_env(None), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(find_free_port())}
    base.update(WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs), GROUP_RANK="0")
    base["PYTHONUNBUFFERED"] = "1"  # a killed rank's prints must already be in its log
    # torch reads these when it is imported: a rank that sets one needs its own interpreter
    fresh = fresh or any(k.startswith(_IMPORT_TIME_PREFIXES) for k in env or {})
    fresh = fresh or os.environ.get(_FRESH_ENV) == "1" or not sys.platform.startswith("linux")
    forks = None if fresh else zygote()
    cmd = [sys.executable, str(_WORKER), str(payload), str(payload.parent)]
    procs: list[Any] = []
    try:
        for rank in range(nprocs):
            rank_env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), **(env or {})}
            if forks is not None:
                pgid = procs[0].pid if procs else 0
                child = forks.Process(
                    target=_forked_rank,
                    args=(str(payload), str(payload.parent), rank_env, pgid),
                    name=f"rank{rank}",
                )
                child.start()
                procs.append(_Forked(child))
                if rank == 0 and nprocs > 1:
                    _join_group_of(procs[0].pid)
                continue
            # a new group, not a new session for rank 0: setpgid cannot cross sessions
            group = _group_kwargs(procs[0].pid if procs else 0)
            with open(payload.parent / f"rank{rank}.log", "wb") as log:
                procs.append(Popen(cmd, stdout=log, stderr=STDOUT, env=rank_env, **group))
    except BaseException:
        _reap(procs)
        raise
    return procs


def _reap(procs: Sequence[Any]) -> None:
    _kill_tree([p.pid for p in procs])
    for proc in procs:
        proc.wait()


def _attempt(
    payload: Path, nprocs: int, timeout: float, env: Mapping[str, str] | None, fresh: bool
) -> tuple[list[Any] | None, str]:
    """One launch. Returns (results, "") or (None, failure report)."""
    work = payload.parent
    procs = _launch(payload, nprocs, env, fresh=fresh)
    verdicts: dict[int, str | None] = {}
    try:
        deadline = time.monotonic() + timeout
        while len(verdicts) < nprocs and time.monotonic() < deadline:
            for rank, proc in enumerate(procs):
                if rank not in verdicts and proc.poll() is not None:
                    verdicts[rank] = _verdict(rank, proc.returncode, work)
                    if verdicts[rank] is not None:
                        deadline = min(deadline, time.monotonic() + _FAIL_FAST_GRACE_S)
            time.sleep(0.05)
        hung = [r for r in range(nprocs) if r not in verdicts]
        for rank in hung:  # the worker's faulthandler prints every thread's stack
            procs[rank].send_signal(signal.SIGUSR1)
        time.sleep(0.5 if hung else 0)
    finally:
        _reap(procs)
    failed = {r: why for r, why in verdicts.items() if why is not None}
    if not failed and not hung:
        return [pickle.loads((work / f"rank{r}.pkl").read_bytes()) for r in range(nprocs)], ""
    details = dict(failed)
    for rank in hung:
        done = (work / f"rank{rank}.pkl").exists()
        details[rank] = f"rank {rank} {'wrote its result but ' if done else 'had not finished; '}"
        details[rank] += "did not exit; killed" if done else "killed"
    if failed:
        head = "run_ranks failed: " + "; ".join(why.splitlines()[0] for why in failed.values())
    else:
        head = f"run_ranks timed out after {timeout:.0f}s: ranks {hung} had not finished"
    parts = [head]
    for rank in [*failed, *hung]:
        log = (work / f"rank{rank}.log").read_text(errors="replace")
        parts.append(f"=== {details[rank]}\n--- rank {rank} output tail ---\n{_tail(log)}")
    return None, "\n".join(parts)


def run_ranks(
    fn: Callable[..., Any],
    nprocs: int,
    *,
    args: tuple[Any, ...] = (),
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    fresh: bool = False,
) -> list[Any]:
    """Runs ``fn(*args)`` in ``nprocs`` new processes with torchrun's environment.

    Args:
        fn: A module-level function of an importable module (a test module is fine). It calls
            ``init_distributed()`` itself and ``cleanup_distributed()`` before returning.
        nprocs: Number of ranks (>= 1).
        args: Picklable positional arguments, the same for every rank.
        timeout: Seconds for the whole run; then every rank and its children are SIGKILLed.
        env: Extra variables for every rank, applied last (they may override the defaults).
        fresh: Start each rank as a fresh interpreter instead of forking it from the zygote
            (for what only a new interpreter shows, e.g. which modules an import pulls in).

    Returns:
        Each rank's unpickled return value, indexed by rank.

    Raises:
        ValueError: If ``fn`` is not importable by qualified name or ``nprocs`` < 1.
        AssertionError: If a rank raised, exited without a result, or the run timed out; the
            message names the ranks and carries their tracebacks and output tails.
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    if "<locals>" in fn.__qualname__ or fn.__module__ == "__main__":
        raise ValueError(f"{fn.__qualname__} must be a module-level function of a module")
    module_file = getattr(sys.modules.get(fn.__module__), "__file__", None)
    data = pickle.dumps((fn.__module__, fn.__qualname__, module_file, args))
    report = ""
    for _ in range(2):  # a second try only if another process took the port first
        with tempfile.TemporaryDirectory(prefix="run_ranks-") as tmp:
            payload = Path(tmp) / "payload.pkl"
            payload.write_bytes(data)
            results, report = _attempt(payload, nprocs, timeout, env, fresh)
            if results is not None:
                return results
            got_any = any(Path(tmp).glob("rank*.pkl"))
        if got_any or not any(s in report.lower() for s in _ADDR_IN_USE):
            break
    raise AssertionError(report)
