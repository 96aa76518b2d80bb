"""Build ``torchrun`` command lines and the environment that makes them reliable.

``torchrun`` (``torch.distributed.run``) starts one process per GPU, wires up the c10d
rendezvous and restarts the group when a worker dies. Nothing here replaces it: this module
only writes its command lines, correctly, so you never fight the flags. It imports no torch,
so ``gpu-training launch-cmd`` answers instantly on a login node.

Every ``*_command`` function is a shell-quoted rendering of the matching ``*_argv`` function;
code that starts ``torchrun`` itself should use the argv lists (no re-parsing, no shell) and
:func:`launch_env` for the environment. :func:`launch_argv` builds the line ``gpu-training
launch`` runs (signals torchrun must forward included) and :func:`run_torchrun` runs it:
signals forwarded, no orphaned workers, the job's exit code returned. The SLURM batch script
and the Kubernetes ``PyTorchJob`` are written by :mod:`gpu_training.launcher.slurm` and
:mod:`gpu_training.launcher.k8s`.

Example:
    >>> from gpu_training.launcher import single_node_command, multi_node_commands
    >>> print(single_node_command("examples/train_ddp.py", 4, ["--epochs", "3"]))
    torchrun --standalone --nproc_per_node=4 examples/train_ddp.py --epochs 3
    >>> for cmd in multi_node_commands("train.py", nnodes=2, nproc_per_node=8,
    ...                                rdzv_endpoint="head-node:29500", rdzv_id="job1"):
    ...     print(cmd)  # doctest: +NORMALIZE_WHITESPACE
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d
        --rdzv_endpoint=head-node:29500 --rdzv_id=job1 train.py
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d
        --rdzv_endpoint=head-node:29500 --rdzv_id=job1 train.py

Security note: the c10d rendezvous endpoint and torchrun's agent store listen on every
interface without authentication (see PyTorch's SECURITY.md). Run multi-node jobs on a
trusted network only.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shlex
from collections.abc import Mapping, Sequence

from gpu_training.config.checks import check_int_argument
from gpu_training.launcher.supervise import (
    EXIT_STOPPED,
    FORWARDED_SIGNALS,
    QUIET_TORCHRUN,
    run_torchrun,
)

__all__ = [
    "EXIT_STOPPED",
    "FORWARDED_SIGNALS",
    "QUIET_TORCHRUN",
    "RDZV_BACKENDS",
    "RESTART_ENV",
    "SIGNALS_TO_HANDLE",
    "TORCHRUN",
    "launch_argv",
    "launch_env",
    "make_rdzv_id",
    "multi_node_argv",
    "multi_node_commands",
    "parse_endpoint",
    "run_torchrun",
    "shared_rdzv_id",
    "single_node_argv",
    "single_node_command",
]

TORCHRUN: tuple[str, ...] = ("torchrun",)
"""The default program prefix; pass ``(sys.executable, "-m", "torch.distributed.run")`` to
the argv helpers to run without ``torchrun`` on ``PATH``."""

RDZV_BACKENDS: tuple[str, ...] = ("c10d", "etcd", "etcd-v2")
"""Dynamic rendezvous backends. ``static`` is excluded: it needs a different ``--node_rank``
on each node, and these commands are identical on every node."""

RESTART_ENV: dict[str, str] = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""Environment for the torchrun agent that makes ``--max_restarts`` recoveries reliable."""

SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
"""torchrun's ``--signals-to-handle``: its default lacks SIGUSR1 (SLURM's ``--signal``), of
which it would die, leaving its workers running as orphans."""

# `[v6addr]:port` or `host:port`; the host of the second form may not contain ':' (bare IPv6).
_ENDPOINT_RE = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Za-z:.%_-]+)\]|(?P<host>[^\s:\[\]]+)):(?P<port>\d+)$"
)


# --- validation ----------------------------------------------------------------------------


def _check_positive_int(name: str, value: object) -> int:
    # bool is an int subclass: nproc=True must not pass as 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value}")
    return value


def _check_script(script: object) -> str:
    if not isinstance(script, (str, os.PathLike)):
        raise ValueError(f"script must be a path to a Python file, got {type(script).__name__}")
    path = os.fspath(script)
    if not isinstance(path, str) or not path.strip():
        raise ValueError("script must be a non-empty path to a Python file")
    return path


def _check_args(args: object) -> list[str]:
    # A bare string is a Sequence[str] too: "--epochs 3" would become 11 one-letter arguments.
    if isinstance(args, (str, bytes)):
        raise ValueError(
            f"args must be a list of strings, not a single string: use shlex.split({args!r})"
        )
    if not isinstance(args, Sequence):
        raise ValueError(f"args must be a list of strings, got {type(args).__name__}")
    bad = [a for a in args if not isinstance(a, str)]
    if bad:
        raise ValueError(
            f"args must be a list of strings, got {bad[0]!r} ({type(bad[0]).__name__}); "
            "convert numbers with str()"
        )
    return list(args)


def _check_flags(flags: object) -> list[str]:
    if isinstance(flags, (str, bytes)) or not isinstance(flags, Sequence):
        raise ValueError(f"extra_flags must be a list of strings, got {type(flags).__name__}")
    if not all(isinstance(f, str) and f.startswith("--") for f in flags):
        raise ValueError(f"extra_flags must be torchrun flags ('--name[=value]'), got {flags!r}")
    return list(flags)


def _check_max_restarts(max_restarts: object) -> int | None:
    if max_restarts is None:
        return None
    return check_int_argument("max_restarts", max_restarts, 0)


def _check_rdzv_id(rdzv_id: object) -> str:
    if not isinstance(rdzv_id, str) or not rdzv_id.strip() or any(c.isspace() for c in rdzv_id):
        raise ValueError(f"rdzv_id must be a non-empty string without spaces, got {rdzv_id!r}")
    return rdzv_id


def parse_endpoint(rdzv_endpoint: str) -> tuple[str, int]:
    """Split and check a rendezvous endpoint ``host:port``.

    Args:
        rdzv_endpoint: ``host:port`` of the rendezvous (the rank-0 node); an IPv6 host is
            written in brackets, ``[::1]:29500``.

    Returns:
        ``(host, port)``; an IPv6 host is returned without its brackets.

    Raises:
        ValueError: If the endpoint is not ``host:port`` or the port is not in 1..65535.

    Example:
        >>> parse_endpoint("head-node:29500")
        ('head-node', 29500)
        >>> parse_endpoint("[::1]:29500")
        ('::1', 29500)
    """
    if not isinstance(rdzv_endpoint, str):
        raise ValueError(
            f"rdzv_endpoint must be a 'host:port' string, got {type(rdzv_endpoint).__name__}"
        )
    match = _ENDPOINT_RE.match(rdzv_endpoint)
    if match is None:
        hint = ""
        if rdzv_endpoint.count(":") > 1 and "[" not in rdzv_endpoint:
            hint = " (write an IPv6 host in brackets, e.g. '[::1]:29500')"
        raise ValueError(
            f"rdzv_endpoint must be 'host:port' (e.g. 'head-node:29500'), got {rdzv_endpoint!r}"
            f"{hint}"
        )
    port = int(match["port"])
    if not 1 <= port <= 65535:
        raise ValueError(f"rdzv_endpoint port must be in 1..65535, got {port} in {rdzv_endpoint!r}")
    return match["v6"] or match["host"], port


# --- argv builders ---------------------------------------------------------------------------


def make_rdzv_id() -> str:
    """A fresh rendezvous id, ``gt-`` followed by 8 random hex digits.

    Example:
        >>> rid = make_rdzv_id()
        >>> rid.startswith("gt-") and len(rid) == 11
        True
    """
    return f"gt-{secrets.token_hex(4)}"


def single_node_argv(
    script: str | os.PathLike[str],
    nproc: int,
    args: Sequence[str] = (),
    *,
    max_restarts: int | None = None,
    program: Sequence[str] = TORCHRUN,
    extra_flags: Sequence[str] = (),
) -> list[str]:
    """The argv of a single-node ``torchrun --standalone`` launch.

    Args:
        script: The training script.
        nproc: Processes (GPUs) on this node.
        args: Arguments for the script, one string each.
        max_restarts: Restart the whole group up to this many times when a worker fails;
            ``None`` leaves torchrun's default (no restarts).
        program: The launcher prefix, ``("torchrun",)`` by default.
        extra_flags: More torchrun flags, placed before the script (e.g. ``"--module"``).

    Returns:
        The argument list, ready for ``subprocess.run`` (no shell needed).

    Raises:
        ValueError: If an argument is invalid; the message names it.

    Example:
        >>> single_node_argv("train.py", 2, ["--lr", "0.1"])
        ['torchrun', '--standalone', '--nproc_per_node=2', 'train.py', '--lr', '0.1']
    """
    path = _check_script(script)
    _check_positive_int("nproc", nproc)
    script_args = _check_args(args)
    restarts = _check_max_restarts(max_restarts)
    flags = _check_flags(extra_flags)
    argv = [*program, "--standalone", f"--nproc_per_node={nproc}"]
    if restarts is not None:
        argv.append(f"--max_restarts={restarts}")
    return [*argv, *flags, path, *script_args]


def multi_node_argv(
    script: str | os.PathLike[str],
    nnodes: int,
    nproc_per_node: int,
    rdzv_endpoint: str,
    args: Sequence[str] = (),
    *,
    rdzv_id: str,
    max_restarts: int | None = None,
    rdzv_backend: str = "c10d",
    program: Sequence[str] = TORCHRUN,
    extra_flags: Sequence[str] = (),
) -> list[str]:
    """The argv every node of a multi-node ``torchrun`` launch runs (it is the same on each).

    Args:
        script: The training script (same path on every node).
        nnodes: Number of nodes.
        nproc_per_node: Processes (GPUs) per node.
        rdzv_endpoint: ``host:port`` of the rendezvous, normally the rank-0 node.
        args: Arguments for the script, one string each.
        rdzv_id: Job id shared by all nodes; required here so that every node gets the same
            one (see :func:`make_rdzv_id`).
        max_restarts: Elastic restarts of the whole group; ``None`` omits the flag.
        rdzv_backend: One of :data:`RDZV_BACKENDS`.
        program: The launcher prefix, ``("torchrun",)`` by default.
        extra_flags: More torchrun flags, placed before the script.

    Returns:
        The argument list, ready for ``subprocess.run`` (no shell needed).

    Raises:
        ValueError: If an argument is invalid; the message names it.

    Example:
        >>> multi_node_argv("t.py", 2, 4, "node0:29500", rdzv_id="job1")[1:4]
        ['--nnodes=2', '--nproc_per_node=4', '--rdzv_backend=c10d']
    """
    path = _check_script(script)
    _check_positive_int("nnodes", nnodes)
    _check_positive_int("nproc_per_node", nproc_per_node)
    parse_endpoint(rdzv_endpoint)
    script_args = _check_args(args)
    restarts = _check_max_restarts(max_restarts)
    job_id = _check_rdzv_id(rdzv_id)
    flags = _check_flags(extra_flags)
    if rdzv_backend not in RDZV_BACKENDS:
        raise ValueError(
            f"rdzv_backend must be one of {', '.join(RDZV_BACKENDS)}, got {rdzv_backend!r}"
        )
    # No --node_rank: c10d ignores it (the first agent to arrive becomes node 0).
    argv = [
        *program,
        f"--nnodes={nnodes}",
        f"--nproc_per_node={nproc_per_node}",
        f"--rdzv_backend={rdzv_backend}",
        f"--rdzv_endpoint={rdzv_endpoint}",
        f"--rdzv_id={job_id}",
    ]
    if restarts is not None:
        argv.append(f"--max_restarts={restarts}")
    return [*argv, *flags, path, *script_args]


# --- shell strings ---------------------------------------------------------------------------


def single_node_command(
    script: str | os.PathLike[str],
    nproc: int,
    args: Sequence[str] = (),
    *,
    max_restarts: int | None = None,
) -> str:
    """The shell command that launches ``script`` on ``nproc`` processes of this node.

    Args:
        script: The training script.
        nproc: Processes (GPUs) on this node.
        args: Arguments for the script, one string each; each is shell-quoted.
        max_restarts: Elastic restarts of the group; ``None`` omits the flag.

    Returns:
        One shell-quoted command line.

    Raises:
        ValueError: If an argument is invalid; the message names it.

    Example:
        >>> single_node_command("examples/train_ddp.py", 4, ["--epochs", "3"])
        'torchrun --standalone --nproc_per_node=4 examples/train_ddp.py --epochs 3'
        >>> single_node_command("train.py", 1, ["--name", "my run"])
        "torchrun --standalone --nproc_per_node=1 train.py --name 'my run'"
    """
    return shlex.join(single_node_argv(script, nproc, args, max_restarts=max_restarts))


def multi_node_commands(
    script: str | os.PathLike[str],
    nnodes: int,
    nproc_per_node: int,
    rdzv_endpoint: str,
    args: Sequence[str] = (),
    *,
    rdzv_id: str | None = None,
    max_restarts: int | None = None,
    rdzv_backend: str = "c10d",
) -> list[str]:
    """The command each node runs for a multi-node launch, one entry per node.

    The lines are identical: with c10d rendezvous the nodes differ only in where they run.
    All share one ``--rdzv_id`` (generated when not given), so they join the same job.

    Args:
        script: The training script (same path on every node).
        nnodes: Number of nodes.
        nproc_per_node: Processes (GPUs) per node.
        rdzv_endpoint: ``host:port`` of the rank-0 node, e.g. ``"head-node:29500"``.
        args: Arguments for the script, one string each; each is shell-quoted.
        rdzv_id: Job id shared by all nodes; ``None`` generates one (:func:`make_rdzv_id`).
        max_restarts: Elastic restarts of the group; ``None`` omits the flag.
        rdzv_backend: One of :data:`RDZV_BACKENDS`.

    Returns:
        ``nnodes`` shell-quoted command lines; line ``i`` is for node ``i``.

    Raises:
        ValueError: If an argument is invalid; the message names it.

    Example:
        >>> cmds = multi_node_commands("train.py", nnodes=2, nproc_per_node=8,
        ...                            rdzv_endpoint="head-node:29500", max_restarts=3)
        >>> len(cmds), cmds[0] == cmds[1], "--max_restarts=3" in cmds[0]
        (2, True, True)
    """
    argv = multi_node_argv(
        script,
        nnodes,
        nproc_per_node,
        rdzv_endpoint,
        args,
        rdzv_id=make_rdzv_id() if rdzv_id is None else rdzv_id,
        max_restarts=max_restarts,
        rdzv_backend=rdzv_backend,
    )
    return [shlex.join(argv)] * nnodes


# --- the line `gpu-training launch` runs ------------------------------------------------------


def shared_rdzv_id(
    rdzv_endpoint: str,
    nnodes: int,
    nproc_per_node: int,
    target: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
) -> str:
    """A rendezvous id that every node of one job computes alike, without talking to the others.

    ``gpu-training launch`` runs separately on each node, so a random id would differ from
    node to node and the agents would never meet. Inside a SLURM job the id is
    ``gt-slurm-<SLURM_JOB_ID>-<SLURM_RESTART_COUNT>`` (a requeued job gets a fresh one);
    elsewhere it is a hash of the launch itself: the same command on every node gives the
    same id, another endpoint or script another one.

    Args:
        rdzv_endpoint: ``host:port`` of the rendezvous.
        nnodes: Number of nodes.
        nproc_per_node: Processes per node.
        target: The script (or module) launched.
        args: Its arguments.
        env: Where to look for ``SLURM_JOB_ID``; ``None`` reads ``os.environ``.

    Returns:
        ``gt-`` followed by the job's identity.

    Example:
        >>> a = shared_rdzv_id("head:29500", 2, 8, "train.py", ["--lr", "1"], env={})
        >>> a == shared_rdzv_id("head:29500", 2, 8, "train.py", ["--lr", "1"], env={})
        True
        >>> a == shared_rdzv_id("head:29501", 2, 8, "train.py", ["--lr", "1"], env={})
        False
        >>> shared_rdzv_id("h:1", 2, 8, "t.py", env={"SLURM_JOB_ID": "4242"})
        'gt-slurm-4242-0'
    """
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID", "").strip()
    if job:
        return f"gt-slurm-{job}-{env.get('SLURM_RESTART_COUNT', '0').strip() or '0'}"
    identity = "\0".join([rdzv_endpoint, str(nnodes), str(nproc_per_node), os.fspath(target)])
    identity += "\0" + "\0".join(args)
    return f"gt-{hashlib.sha256(identity.encode()).hexdigest()[:8]}"


def launch_argv(
    target: str | os.PathLike[str],
    nproc_per_node: int,
    args: Sequence[str] = (),
    *,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    max_restarts: int | None = None,
    module: bool = False,
    program: Sequence[str] = TORCHRUN,
) -> list[str]:
    """The torchrun argv of ``gpu-training launch``: standalone on one node, c10d across nodes.

    Always adds ``--signals-to-handle`` (:data:`SIGNALS_TO_HANDLE`) so that SLURM's
    ``SIGUSR1`` reaches the workers instead of killing torchrun. Without an endpoint the job
    is single-node (``--standalone``); with one, the c10d rendezvous is used and every node
    gets the same ``--rdzv_id`` (``rdzv_id``, or :func:`shared_rdzv_id`). No ``--node_rank``:
    c10d ignores it.

    Args:
        target: The training script, or a module name when ``module`` is True.
        nproc_per_node: Processes (GPUs) per node.
        args: Arguments for the script, one string each.
        nnodes: Number of nodes; > 1 needs ``rdzv_endpoint``.
        rdzv_endpoint: ``host:port`` of the rendezvous; None for a single-node job.
        rdzv_id: Job id shared by all nodes; None derives one with :func:`shared_rdzv_id`.
        max_restarts: Elastic restarts of the whole group; None leaves torchrun's default (0).
        module: Run ``python -m target`` instead of a script.
        program: The launcher prefix, ``("torchrun",)`` by default.

    Returns:
        The argument list, ready for :func:`run_torchrun`.

    Raises:
        ValueError: If an argument is invalid or ``nnodes > 1`` has no endpoint.

    Example:
        >>> launch_argv("train.py", 2, max_restarts=1)
        ['torchrun', '--standalone', '--nproc_per_node=2', '--max_restarts=1', \
'--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1', 'train.py']
        >>> argv = launch_argv("train.py", 4, nnodes=2, rdzv_endpoint="node0:29500")
        >>> [a for a in argv if a.startswith("--rdzv")][:2]
        ['--rdzv_backend=c10d', '--rdzv_endpoint=node0:29500']
    """
    _check_positive_int("nnodes", nnodes)
    flags = [f"--signals-to-handle={SIGNALS_TO_HANDLE}", *(["--module"] if module else [])]
    if rdzv_endpoint is None:
        if nnodes > 1:
            raise ValueError(f"rdzv_endpoint (host:port of one node) is needed for nnodes={nnodes}")
        if rdzv_id is not None:
            raise ValueError("rdzv_id needs an rdzv_endpoint (a single-node job has its own)")
        return single_node_argv(
            target,
            nproc_per_node,
            args,
            max_restarts=max_restarts,
            program=program,
            extra_flags=flags,
        )
    parse_endpoint(rdzv_endpoint)
    if rdzv_id is None:
        rdzv_id = shared_rdzv_id(
            rdzv_endpoint, nnodes, nproc_per_node, _check_script(target), _check_args(args)
        )
    return multi_node_argv(
        target,
        nnodes,
        nproc_per_node,
        rdzv_endpoint,
        args,
        rdzv_id=rdzv_id,
        max_restarts=max_restarts,
        program=program,
        extra_flags=flags,
    )


# --- environment -----------------------------------------------------------------------------


def _cpu_count() -> int:
    # The CPUs this process may run on (cgroup/affinity aware where the OS says), not the host's.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def launch_env(
    base: Mapping[str, str] | None = None, *, nproc_per_node: int = 1, restarts: bool = True
) -> dict[str, str]:
    """The environment to start ``torchrun`` with.

    Adds, unless ``base`` already sets them:

    * ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, when the job may restart (``restarts``) —
      by default the agent reuses the rendezvous TCP store across restart attempts, and a
      ``--max_restarts`` recovery after a worker was killed often failed (gloo "Connection
      refused" or a hang; pytorch issues 135712, 167288); with it set, it recovered reliably
      (benchmarks/README.md, "Traps"). A job that never restarts goes without it: its workers
      then use the agent's store, on a port the agent already listens on. With it, rank 0
      opens a second store on a port the agent found free a moment before, and any process
      that takes that port first (an outgoing connection is given one from the same range)
      fails the job with ``EADDRINUSE`` (benchmarks/README.md, "Traps").
    * ``OMP_NUM_THREADS = max(1, cpus // nproc_per_node)`` — when it is unset and
      ``nproc_per_node > 1`` torchrun forces it to 1 (and prints a warning banner), which
      starves CPU-side work such as data loading and gloo; an even share of the CPUs is
      the better default.

    Args:
        base: The environment to start from; ``None`` copies ``os.environ``. Not modified.
        nproc_per_node: Worker processes per node, to share the CPUs between.
        restarts: Whether torchrun may restart the workers (``--max_restarts`` > 0).

    Returns:
        A new dict: ``base`` plus the variables above.

    Raises:
        ValueError: If ``nproc_per_node`` is not an integer >= 1.

    Example:
        >>> env = launch_env({"PATH": "/usr/bin", "OMP_NUM_THREADS": "4"}, nproc_per_node=2)
        >>> env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"], env["OMP_NUM_THREADS"]
        ('1', '4')
        >>> "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" in launch_env({}, restarts=False)
        False
    """
    _check_positive_int("nproc_per_node", nproc_per_node)
    env = dict(os.environ if base is None else base)
    for key, value in RESTART_ENV.items() if restarts else ():
        env.setdefault(key, value)
    env.setdefault("OMP_NUM_THREADS", str(max(1, _cpu_count() // nproc_per_node)))
    return env
