"""Write (and submit) the SLURM batch script of a multi-node torchrun job.

One ``torchrun`` agent per node, started by ``srun``; the agents meet at a c10d rendezvous
hosted on the job's first node; the rendezvous id is unique per job (and per requeue). Before
the time limit SLURM signals the batch shell (``--signal=B:USR1@90``), which passes the signal
on to ``srun`` -> torchrun -> every worker: workers using
:class:`~gpu_training.preemption.PreemptionHandler` (the Trainer does) save a checkpoint and
stop, and the script requeues the job, which resumes from that checkpoint. It imports no torch.

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

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence

from gpu_training.config.checks import check_int_argument
from gpu_training.launcher import RESTART_ENV, SIGNALS_TO_HANDLE

__all__ = ["PREEMPT_WARNING_S", "sbatch_script", "submit"]

PREEMPT_WARNING_S = 90
"""Seconds before the time limit at which the job is told to checkpoint and stop."""

# SLURM's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (or UNLIMITED).
_TIME_RE = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED)$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")


def _check(name: str, value: object, pattern: re.Pattern[str], expected: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


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
) -> str:
    """The ``sbatch`` script that runs ``target`` on ``nodes`` x ``gpus_per_node`` processes.

    The script starts one torchrun agent per node with ``srun``; ``MASTER_ADDR`` is the first
    host of ``scontrol show hostnames "$SLURM_JOB_NODELIST"``; the rendezvous id is
    ``gt-slurm-$SLURM_JOB_ID-$SLURM_RESTART_COUNT``; the environment that makes elastic
    restarts work (:data:`~gpu_training.launcher.RESTART_ENV`) and ``OMP_NUM_THREADS`` (an
    even share of the task's CPUs) are exported. ``--signal=B:USR1@90`` warns the batch shell
    :data:`PREEMPT_WARNING_S` seconds before the limit (and a ``SIGTERM``, on preemption or at
    the limit, is caught alike): it passes the signal on to the workers, waits for them to
    save and stop, and requeues the job (``scontrol requeue``) unless it had finished anyway.

    Args:
        target: The training script (or a module with ``module=True``), as the compute nodes
            see it: the job starts in the directory it was submitted from.
        args: Its arguments, one string each (shell-quoted in the script).
        nodes: Number of nodes.
        gpus_per_node: GPUs, and worker processes, per node.
        module: Run ``python -m target`` instead of a script.
        max_restarts: torchrun's elastic restarts of the whole group; None: torchrun's default.
        time: The time limit in a SLURM format (``"04:00:00"``, ``"2-00:00:00"``).
        partition: The partition to submit to.
        job_name: The job's name (default: the script's name).
        port: The rendezvous port on the first node (default: 29500 + job id % 1000, so two
            jobs sharing a node do not collide).
        cpus_per_node: CPUs to request for each node's agent and its workers.

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
    path = os.fspath(target)
    if not path.strip():
        raise ValueError("target must be a non-empty script path or module name")
    name = job_name or os.path.splitext(os.path.basename(path))[0] or "gpu-training"
    _check("job_name", name, _NAME_RE, "letters, digits and _.+- only")

    directives = [
        f"--job-name={name}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        f"--gpus-per-node={gpus_per_node}",
    ]
    if cpus_per_node is not None:
        directives.append(f"--cpus-per-task={cpus_per_node}")
    if time is not None:
        directives.append(f"--time={_check('time', time, _TIME_RE, 'a SLURM time limit')}")
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
        "torchrun",
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
        "# A warning (USR1) or SIGTERM: pass it on to the workers (they checkpoint and stop),",
        "# then requeue. srun forwards it to the torchrun agents, which forward it to the workers.",
        "requeue=0",
        'srun_pid=""',
        "on_signal() {",
        "    requeue=1",
        "    interrupted=1",
        '    echo "gpu-training: SIG$1 received: asking the workers to checkpoint and stop"',
        '    if [ -n "$srun_pid" ]; then kill -s "$1" "$srun_pid" 2>/dev/null || true; fi',
        "}",
        "trap 'on_signal USR1' USR1",
        "trap 'on_signal TERM' TERM",
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
        'if [ "$requeue" = 1 ] && [ "$rc" -ne 0 ]; then',
        '    echo "gpu-training: stopped early (exit code $rc): requeueing job $SLURM_JOB_ID"',
        '    scontrol requeue "$SLURM_JOB_ID"',
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
