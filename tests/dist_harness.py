"""Run N gloo ranks, a torchrun job or one Python process from a test, with a hard timeout.

Every multi-rank test goes through :func:`run_ranks`: each rank is a fresh Python process with
the environment torchrun would give it, the ranks share one process group so a hang ends with
one ``killpg``, and the verdict comes from the result files the ranks wrote, not their exit
codes (DESIGN.md, "Traps": ~3% of healthy 2-rank gloo runs abort at interpreter exit).

Example:
    >>> def _worker(scale: float) -> float:  # module level in a test module
    ...     ctx = init_distributed()
    ...     ...
    >>> results = run_ranks(_worker, 2, args=(0.5,), timeout=60)
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from subprocess import STDOUT, Popen
from typing import Any

__all__ = ["REPO_ROOT", "TESTS_DIR", "find_free_port", "run_python", "run_ranks", "run_script"]

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
_WORKER = TESTS_DIR / "_rank_worker.py"
_LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")
_FAIL_FAST_GRACE_S = 3.0  # once one rank failed, the others get this long before being killed
_ADDR_IN_USE = ("address already in use", "eaddrinuse")
_EXIT_ABORT_TEXT = "terminate called without an active exception"


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


def _launch(payload: Path, nprocs: int, env: Mapping[str, str] | None) -> list[Popen[bytes]]:
    """Starts the ranks in one process group led by rank 0, output to ``rank{R}.log``."""
    base = {**_base_env(None), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(find_free_port())}
    base.update(WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs), GROUP_RANK="0")
    base["PYTHONUNBUFFERED"] = "1"  # a killed rank's prints must already be in its log
    cmd = [sys.executable, str(_WORKER), str(payload), str(payload.parent)]
    procs: list[Popen[bytes]] = []
    try:
        for rank in range(nprocs):
            rank_env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), **(env or {})}
            # a new group, not a new session for rank 0: setpgid cannot cross sessions
            group = _group_kwargs(procs[0].pid if procs else 0)
            with open(payload.parent / f"rank{rank}.log", "wb") as log:
                procs.append(Popen(cmd, stdout=log, stderr=STDOUT, env=rank_env, **group))
    except BaseException:
        _reap(procs)
        raise
    return procs


def _reap(procs: Sequence[Popen[bytes]]) -> None:
    _kill_tree([p.pid for p in procs])
    for proc in procs:
        proc.wait()


def _attempt(
    payload: Path, nprocs: int, timeout: float, env: Mapping[str, str] | None
) -> tuple[list[Any] | None, str]:
    """One launch. Returns (results, "") or (None, failure report)."""
    work = payload.parent
    procs = _launch(payload, nprocs, env)
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
) -> list[Any]:
    """Runs ``fn(*args)`` in ``nprocs`` fresh processes with torchrun's environment.

    Args:
        fn: A module-level function of an importable module (a test module is fine). It calls
            ``init_distributed()`` itself and ``cleanup_distributed()`` before returning.
        nprocs: Number of ranks (>= 1).
        args: Picklable positional arguments, the same for every rank.
        timeout: Seconds for the whole run; then every rank and its children are SIGKILLed.
        env: Extra variables for every rank, applied last (they may override the defaults).

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
            results, report = _attempt(payload, nprocs, timeout, env)
            if results is not None:
                return results
            got_any = any(Path(tmp).glob("rank*.pkl"))
        if got_any or not any(s in report.lower() for s in _ADDR_IN_USE):
            break
    raise AssertionError(report)
