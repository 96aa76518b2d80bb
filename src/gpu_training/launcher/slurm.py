"""Write (and submit) the SLURM batch script of a multi-node torchrun job.

One ``torchrun`` agent per node, started by ``srun`` with the interpreter that wrote the
script (``python -m gpu_training.launcher.torchrun``: torchrun with a quiet end and exit code
143 after a stop signal); the agents meet at a c10d rendezvous hosted on the job's first node;
the rendezvous id is unique per job (and per requeue). Before the time limit SLURM signals the
batch shell (``--signal=B:USR1@90``), which passes the signal on to ``srun`` -> torchrun ->
every worker: workers using :class:`~gpu_training.preemption.PreemptionHandler` (the Trainer
does) save a checkpoint and stop, and the script requeues the job, which resumes from that
checkpoint. The time limit itself, a preemption and a signal sent to the job steps only
requeue it too; ``scancel`` cancels it. It imports no torch.

Example:
    >>> script = sbatch_script("train.py", ["--epochs", "3"], nodes=2, gpus_per_node=8,
    ...                        time="04:00:00", max_restarts=2)
    >>> print("\\n".join(l for l in script.splitlines() if l.startswith("#SBATCH")))
    #SBATCH --job-name=train
    #SBATCH --nodes=2
    #SBATCH --ntasks-per-node=1
    #SBATCH --gpus-per-node=8
    #SBATCH --time=04:00:00
    #SBATCH --signal=B:USR1@90
    #SBATCH --requeue
    #SBATCH --open-mode=append
    #SBATCH --output=%x-%j.out
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence

from gpu_training.config.checks import check_int_argument
from gpu_training.launcher import EXIT_STOPPED, RESTART_ENV, SIGNALS_TO_HANDLE

__all__ = ["GPU_REQUESTS", "PREEMPT_WARNING_S", "sbatch_script", "submit", "time_limit_seconds"]

PREEMPT_WARNING_S = 90
"""Seconds before the time limit at which the job is told to checkpoint and stop."""

GPU_REQUESTS: tuple[str, ...] = ("gpus-per-node", "gres", "none")
"""How the script asks for GPUs: ``#SBATCH --gpus-per-node=N``, ``#SBATCH --gres=gpu:N``
(sites and versions without ``--gpus-per-node``), or not at all (a CPU-only partition)."""

# SLURM's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (or UNLIMITED).
_TIME_RE = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED)$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")


def _check(name: str, value: object, pattern: re.Pattern[str], expected: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def time_limit_seconds(limit: str) -> float:
    """The seconds in a SLURM time limit (``math.inf`` for ``UNLIMITED`` or ``0``).

    Args:
        limit: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S`` or ``UNLIMITED``.

    Returns:
        The limit in seconds.

    Raises:
        ValueError: If ``limit`` is not a SLURM time limit.

    Example:
        >>> time_limit_seconds("1:30"), time_limit_seconds("1-00:00:00")
        (90, 86400)
    """
    _check("time", limit, _TIME_RE, "a SLURM time limit")
    if limit == "UNLIMITED":
        return math.inf
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:
        hours, minutes, seconds = [*parts, 0, 0][:3]  # D-H, D-H:M, D-H:M:S
    elif len(parts) == 3:
        hours, minutes, seconds = parts  # H:M:S
    else:
        hours, (minutes, seconds) = 0, [*parts, 0][:2]  # M, M:S
    total = ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
    return math.inf if total == 0 else total  # sbatch: a limit of zero is no limit


def sbatch_script(
    target: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    nodes: int,
    gpus_per_node: int,
    module: bool = False,
    max_restarts: int | None = None,
    time: str | None = None,
    partition: str | None = None,
    job_name: str | None = None,
    port: int | None = None,
    cpus_per_node: int | None = None,
    gpu_request: str = "gpus-per-node",
    python: str | None = None,
) -> str:
    """The ``sbatch`` script that runs ``target`` on ``nodes`` x ``gpus_per_node`` processes.

    The script starts one torchrun agent per node with ``srun``, as ``PYTHON -m
    gpu_training.launcher.torchrun`` (torchrun with a quiet end: exit code 143 after a stop
    signal, whichever process got it); ``MASTER_ADDR`` is the first host of ``scontrol show
    hostnames "$SLURM_JOB_NODELIST"``; the rendezvous id is
    ``gt-slurm-$SLURM_JOB_ID-$SLURM_RESTART_COUNT``; the environment that makes elastic
    restarts work (:data:`~gpu_training.launcher.RESTART_ENV`) and ``OMP_NUM_THREADS`` (an
    even share of the task's CPUs) are exported. ``--signal=B:USR1@90`` warns the batch shell
    :data:`PREEMPT_WARNING_S` seconds before the limit; it passes the signal on to the workers,
    which save and stop, and requeues the job (``scontrol requeue``) unless it had finished.
    A signal sent to the job steps only, the time limit's ``SIGTERM`` and a preemption requeue
    it alike (the workers exit with 143); ``scancel`` cancels it.

    Args:
        target: The training script (or a module with ``module=True``), as the compute nodes
            see it: the job starts in the directory it was submitted from.
        args: Its arguments, one string each (shell-quoted in the script).
        nodes: Number of nodes.
        gpus_per_node: GPUs, and worker processes, per node.
        module: Run ``python -m target`` instead of a script.
        max_restarts: torchrun's elastic restarts of the whole group; None: torchrun's default.
        time: The time limit in a SLURM format (``"04:00:00"``, ``"2-00:00:00"``), longer than
            the :data:`PREEMPT_WARNING_S` warning.
        partition: The partition to submit to.
        job_name: The job's name (default: the script's name).
        port: The rendezvous port on the first node (default: 29500 + job id % 1000, so two
            jobs sharing a node do not collide).
        cpus_per_node: CPUs to request for each node's agent and its workers.
        gpu_request: One of :data:`GPU_REQUESTS`: ``--gpus-per-node=N``, ``--gres=gpu:N``, or
            no GPU request (a CPU-only partition).
        python: The interpreter the nodes run (default: this one, ``sys.executable``), an
            absolute path: the job does not depend on the ``PATH`` it is submitted with.

    Returns:
        The script's text.

    Raises:
        ValueError: If an argument is invalid; the message names it.
    """
    check_int_argument("nodes", nodes)
    check_int_argument("gpus_per_node", gpus_per_node)
    if isinstance(args, (str, bytes)) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"args must be a list of strings, got {args!r}")
    if max_restarts is not None:
        check_int_argument("max_restarts", max_restarts, 0)
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)):
        raise ValueError(f"port must be an integer in 1..65535, got {port!r}")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"port must be an integer in 1..65535, got {port!r}")
    if cpus_per_node is not None:
        check_int_argument("cpus_per_node", cpus_per_node)
    if gpu_request not in GPU_REQUESTS:
        raise ValueError(
            f"gpu_request must be one of {', '.join(GPU_REQUESTS)}, got {gpu_request!r}"
        )
    interpreter = sys.executable if python is None else python
    if not isinstance(interpreter, str) or not os.path.isabs(interpreter):
        raise ValueError(f"python must be an absolute path to an interpreter, got {interpreter!r}")
    if time is not None and time_limit_seconds(time) <= PREEMPT_WARNING_S:
        raise ValueError(
            f"time must be longer than the {PREEMPT_WARNING_S} s warning the job gets to "
            f"checkpoint before its limit (--signal=B:USR1@{PREEMPT_WARNING_S}), got {time!r}"
        )
    path = os.fspath(target)
    if not path.strip():
        raise ValueError("target must be a non-empty script path or module name")
    name = job_name or os.path.splitext(os.path.basename(path))[0] or "gpu-training"
    _check("job_name", name, _NAME_RE, "letters, digits and _.+- only")

    gpus = {
        "gpus-per-node": [f"--gpus-per-node={gpus_per_node}"],
        "gres": [f"--gres=gpu:{gpus_per_node}"],
        "none": [],
    }[gpu_request]
    directives = [f"--job-name={name}", f"--nodes={nodes}", "--ntasks-per-node=1", *gpus]
    if cpus_per_node is not None:
        directives.append(f"--cpus-per-task={cpus_per_node}")
    if time is not None:
        directives.append(f"--time={time}")
    if partition is not None:
        directives.append(f"--partition={_check('partition', partition, _NAME_RE, 'a name')}")
    directives += [
        f"--signal=B:USR1@{PREEMPT_WARNING_S}",
        "--requeue",
        "--open-mode=append",
        "--output=%x-%j.out",
    ]
    restarts = [] if max_restarts is None else [f"--max_restarts={max_restarts}"]
    torchrun = [
        shlex.quote(interpreter),
        "-m",
        "gpu_training.launcher.torchrun",
        f"--nnodes={nodes}",
        f"--nproc_per_node={gpus_per_node}",
        "--rdzv_backend=c10d",
        '--rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT"',
        '--rdzv_id="$RDZV_ID"',
        *restarts,
        f"--signals-to-handle={SIGNALS_TO_HANDLE}",
        *(["--module"] if module else []),
        shlex.quote(path),
        *(shlex.quote(a) for a in args),
    ]
    port_line = f"MASTER_PORT={port}" if port else "MASTER_PORT=$((29500 + SLURM_JOB_ID % 1000))"
    exports = [f"export {key}={value}" for key, value in RESTART_ENV.items()]
    lines = [
        "#!/bin/bash",
        "# Written by `gpu-training launch --slurm`. Submit with: sbatch THIS_FILE",
        "# One task per node: a torchrun agent, which starts that node's workers.",
        *(f"#SBATCH {d}" for d in directives),
        "",
        "# Why these settings: docs/multi-node.md.",
        "set -u",
        "# Without it, torchrun reuses the rendezvous store across restarts (5/12 recoveries)",
        *exports,
        f'CPUS="${{SLURM_CPUS_PER_TASK:-{gpus_per_node}}}"',
        f'export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-$(( CPUS / {gpus_per_node} > 0 ? '
        f'CPUS / {gpus_per_node} : 1 ))}}"',
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        port_line,
        'RDZV_ID="gt-slurm-${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0}"',
        'echo "gpu-training: ${SLURM_JOB_NUM_NODES:-?} node(s), rendezvous'
        ' $MASTER_ADDR:$MASTER_PORT id $RDZV_ID"',
        "",
        "# The warning (USR1) or SIGTERM: pass it on to srun, which passes it on to the torchrun",
        "# agents, which pass it on to the workers: they checkpoint and stop.",
        'signalled=""',
        'srun_pid=""',
        "on_signal() {",
        '    signalled="$1"',
        "    interrupted=1",
        '    echo "gpu-training: SIG$1 received: asking the workers to checkpoint and stop"',
        '    if [ -n "$srun_pid" ]; then kill -s "$1" "$srun_pid" 2>/dev/null || true; fi',
        "}",
        "trap 'on_signal USR1' USR1",
        "trap 'on_signal TERM' TERM",
        "",
        "# scancel: the job is ending (not RUNNING), not at its time limit, not preempted",
        "# (a preempted job has a PreemptTime date; a warning leaves it RUNNING).",
        "cancelled() {",
        "    local job",
        '    job="$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null)" || return 1',
        '    case "$job" in *JobState=RUNNING*|*Reason=TimeLimit*|*PreemptTime=[0-9]*) return 1 ;; esac',
        "}",
        "",
        f"srun --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
        "    " + " \\\n        ".join(_wrap(torchrun)) + " &",
        "srun_pid=$!",
        "while :; do",
        "    interrupted=0",
        '    wait "$srun_pid"',
        "    rc=$?",
        '    [ "$interrupted" = 1 ] || break  # a trap interrupted wait: srun still runs',
        "done",
        f"# {EXIT_STOPPED}: the workers saved and stopped on request (a signal to the steps only too)",
        f'if [ "$rc" -ne 0 ] && {{ [ -n "$signalled" ] || [ "$rc" -eq {EXIT_STOPPED} ]; }}; then',
        "    if cancelled; then",
        '        echo "gpu-training: job $SLURM_JOB_ID cancelled (exit code $rc): not requeued"',
        "    else",
        '        echo "gpu-training: stopped early (exit code $rc): requeueing job $SLURM_JOB_ID"',
        '        scontrol requeue "$SLURM_JOB_ID"',
        "    fi",
        "fi",
        'exit "$rc"',
        "",
    ]
    return "\n".join(lines)


def _wrap(words: Sequence[str], width: int = 84) -> list[str]:
    """Groups ``words`` into lines of at most ``width`` characters (for a readable script)."""
    out: list[str] = []
    for word in words:
        if out and len(out[-1]) + 1 + len(word) <= width:
            out[-1] += " " + word
        else:
            out.append(word)
    return out


def submit(script: str, *, sbatch: str = "sbatch") -> subprocess.CompletedProcess[str]:
    """Submit ``script`` with ``sbatch`` (reading it from standard input).

    Args:
        script: The batch script's text, e.g. from :func:`sbatch_script`.
        sbatch: The ``sbatch`` program to run.

    Returns:
        The finished ``sbatch`` process (``stdout``: ``Submitted batch job N``).

    Raises:
        FileNotFoundError: If ``sbatch`` is not on ``PATH`` (not a SLURM login node).
    """
    program = shutil.which(sbatch)
    if program is None:
        raise FileNotFoundError(f"{sbatch} not found on PATH")
    return subprocess.run([program], input=script, text=True, capture_output=True, check=False)
