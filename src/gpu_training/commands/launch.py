"""``gpu-training launch``: start torchrun for a script or a job config, or write its SLURM or
Kubernetes job.

Three modes, one set of flags:

* **run** (default): start ``torchrun`` here, standalone on one node or as one node of a
  c10d rendezvous (``--nnodes M --rdzv-endpoint HOST:PORT``, run on every node), with the
  environment that makes ``--max-restarts`` recoveries work, signals forwarded to the
  workers and the job's exit code as ours (:func:`gpu_training.launcher.run_torchrun`).
  ``--print`` shows the commands instead.
* ``--slurm``: print (or ``--submit``) an ``sbatch`` script (:mod:`gpu_training.launcher.slurm`).
* ``--k8s``: print a Kubeflow ``PyTorchJob`` manifest (:mod:`gpu_training.launcher.k8s`).

``SCRIPT_OR_CONFIG`` is a Python script, or a job file (``.yaml``/``.yml``/``.json``) run as
``gpu-training train CONFIG ARGS`` on every rank. Bad input is reported before anything starts.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]

_CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
_SLURM_ONLY = ("time", "partition", "job_name", "port", "submit", "gpu_request")
_K8S_ONLY = (
    "image",
    "name",
    "namespace",
    "min_nodes",
    "max_nodes",
    "restart_policy",
    "checkpoint_claim",
    "checkpoint_mount",
)
_EPILOG = """\
examples:
  gpu-training launch --nproc 8 --max-restarts 3 train.py --epochs 10
  gpu-training launch --nproc 2 configs/ddp_config.yaml --set training.max_steps=100
  gpu-training launch --nnodes 2 --nproc 8 --rdzv-endpoint node0:29500 train.py  # on each node
  gpu-training launch --slurm --nodes 4 --gpus-per-node 8 --time 24:00:00 --submit train.py
  gpu-training launch --k8s --nodes 2 --gpus-per-node 8 --image registry/me/train:1 train.py
"""


def register(subparsers: Any) -> None:
    """Adds the ``launch`` and ``launch-cmd`` subcommands to ``gpu-training``.

    Args:
        subparsers: The ``add_subparsers()`` action of the ``gpu-training`` parser.
    """
    from gpu_training.commands.argtypes import non_negative_int, positive_int
    from gpu_training.launcher.k8s import RESTART_POLICIES
    from gpu_training.launcher.slurm import GPU_REQUESTS

    register_launch_cmd(subparsers)  # the torchrun command lines only, nothing started

    parser = subparsers.add_parser(
        "launch",
        help="start torchrun (elastic, multi-node), or write its SLURM / Kubernetes job",
        description=(
            "Start torchrun for SCRIPT_OR_CONFIG (a Python script, or a job file run as\n"
            "'gpu-training train CONFIG ARGS') with the right flags and environment, forward\n"
            "signals to the workers and exit with the job's code; or print the commands\n"
            "(--print), an sbatch script (--slurm) or a Kubeflow PyTorchJob (--k8s).\n\n"
            "Trust: SCRIPT_OR_CONFIG is code. A job file's import strings (task.model,\n"
            "task.data, task.loss, a task factory) are imported and called to check the job,\n"
            "even with --print, --slurm or --k8s: launch only scripts and job files you trust."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--nproc",
        "--gpus-per-node",
        dest="nproc",
        type=positive_int,
        metavar="N",
        help="processes per node, one per GPU (default: the GPUs visible here, or 1)",
    )
    parser.add_argument(
        "--nnodes",
        "--nodes",
        dest="nnodes",
        type=positive_int,
        default=1,
        metavar="M",
        help="nodes (default 1)",
    )
    parser.add_argument(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="c10d rendezvous on one of the nodes (needed when --nnodes > 1)",
    )
    parser.add_argument(
        "--rdzv-id",
        metavar="ID",
        help="job id shared by the nodes (default: derived from the command, the same on each)",
    )
    parser.add_argument(
        "--max-restarts",
        type=non_negative_int,
        metavar="K",
        help="restart the whole group up to K times when a worker fails (elastic)",
    )
    parser.add_argument(
        "--print", dest="print_only", action="store_true", help="print the commands, run nothing"
    )
    slurm = parser.add_argument_group("SLURM (--slurm)")
    slurm.add_argument("--slurm", action="store_true", help="print an sbatch script")
    slurm.add_argument("--submit", action="store_true", help="submit it with sbatch instead")
    slurm.add_argument("--time", metavar="LIMIT", help="time limit, e.g. 24:00:00")
    slurm.add_argument("--partition", metavar="NAME", help="partition")
    slurm.add_argument("--job-name", metavar="NAME", help="job name (default: the script's)")
    slurm.add_argument(
        "--port", type=positive_int, metavar="PORT", help="rendezvous port on the first node"
    )
    slurm.add_argument(
        "--gpu-request",
        choices=GPU_REQUESTS,
        help="how the script asks for GPUs: --gpus-per-node=N (the default), --gres=gpu:N, "
        "or none (a CPU-only partition)",
    )
    parser.add_argument(
        "--cpus-per-node",
        type=positive_int,
        metavar="C",
        help="CPUs to request per node (--slurm, --k8s)",
    )
    k8s = parser.add_argument_group("Kubernetes (--k8s)")
    k8s.add_argument("--k8s", action="store_true", help="print a Kubeflow PyTorchJob manifest")
    k8s.add_argument("--image", metavar="IMAGE", help="container image (required with --k8s)")
    k8s.add_argument("--name", metavar="NAME", help="job name (default: from the script)")
    k8s.add_argument("--namespace", metavar="NS", help="namespace")
    k8s.add_argument(
        "--min-nodes", type=positive_int, metavar="N", help="fewest pods to train with"
    )
    k8s.add_argument("--max-nodes", type=positive_int, metavar="N", help="most pods")
    k8s.add_argument(
        "--restart-policy",
        choices=RESTART_POLICIES,
        metavar="POLICY",
        help=f"pod restart policy: {', '.join(RESTART_POLICIES)} (default OnFailure)",
    )
    k8s.add_argument(
        "--checkpoint-claim", metavar="PVC", help="PersistentVolumeClaim for checkpoints"
    )
    k8s.add_argument(
        "--checkpoint-mount", metavar="PATH", help="its mount path (default /checkpoints)"
    )
    parser.add_argument("target", metavar="SCRIPT_OR_CONFIG", help="a .py script or a job file")
    parser.add_argument(
        "target_args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for it"
    )
    parser.set_defaults(_run=_run_launch)


# --- checks ---------------------------------------------------------------------------------


def _usage(message: str) -> Exception:
    from gpu_training.cli import UsageError

    return UsageError(f"launch: {message}")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_modes(args: argparse.Namespace) -> None:
    if args.slurm and args.k8s:
        raise _usage("--slurm and --k8s are exclusive: choose one")
    for mode, names in (("--slurm", _SLURM_ONLY), ("--k8s", _K8S_ONLY)):
        used = [n for n in names if getattr(args, n) not in (None, False)]
        if used and not getattr(args, mode[2:]):
            raise _usage(f"{_flag(used[0])} needs {mode}")
    if (args.slurm or args.k8s) and args.print_only:
        raise _usage("--print is for a local launch: --slurm and --k8s print already")
    if args.cpus_per_node is not None and not (args.slurm or args.k8s):
        raise _usage("--cpus-per-node needs --slurm or --k8s")
    if args.slurm or args.k8s:
        mode = "--slurm" if args.slurm else "--k8s"
        if args.nproc is None:
            raise _usage(f"{mode} needs --gpus-per-node N (processes per node)")
        if args.rdzv_endpoint is not None or args.rdzv_id is not None:
            raise _usage(f"{mode} sets the rendezvous itself: drop --rdzv-endpoint/--rdzv-id")
    if args.k8s and not args.image:
        raise _usage("--k8s needs --image IMAGE (the container with your code)")


def _is_config(target: str) -> bool:
    return target.lower().endswith(_CONFIG_SUFFIXES)


def _check_target_exists(target: str) -> None:
    path = Path(target)
    if not path.exists():
        kind = "job file" if _is_config(target) else "script"
        raise _usage(f"SCRIPT_OR_CONFIG: {kind} {target!r} does not exist")
    if not path.is_file():
        what = "a directory" if path.is_dir() else "a special file"
        raise _usage(
            f"SCRIPT_OR_CONFIG: {target!r} is not a file ({what}); expected a script or a job file"
        )


def _check_job(config: str, train_args: list[str], ranks: tuple[int, int] | None) -> None:
    """Loads the job and its ``--set`` overrides like ``train`` will, on every rank.

    ``ranks`` (processes per node, nodes), when known here: the global batch must split over
    them, or every rank would fail at its first step.
    """
    from gpu_training.cli import UsageError, build_parser
    from gpu_training.config import ConfigError
    from gpu_training.job import load_job
    from gpu_training.strategy.job_check import check_job
    from gpu_training.strategy.tensor_parallel import check_degree

    try:
        parsed = build_parser().parse_args(["train", config, *train_args])
    except UsageError as err:
        raise _usage(f"ARGS for the job: {str(err).removeprefix('train: ')}") from None
    if parsed.nproc != 1:
        raise _usage("give the process count to launch (--nproc N before CONFIG), not in ARGS")
    job = load_job(config, list(parsed.overrides))
    if ranks is not None:  # first: a degree that splits no world of this size says so
        check_degree(ranks[0] * ranks[1], job.strategy.tensor_parallel)
    check_job(job)
    if ranks is None:
        return
    nproc, nnodes = ranks
    flags = f"--nproc {nproc}" + (f" x --nnodes {nnodes}" if nnodes > 1 else "")
    try:
        job.training.for_world_size(nproc * nnodes // job.strategy.tensor_parallel)
    except ConfigError as err:
        raise ConfigError(f"{flags}: {err}", "training.global_batch_size") from None


def _default_nproc() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 1


# --- the modes ---------------------------------------------------------------------------------


def _run_launch(args: argparse.Namespace) -> int:
    _check_modes(args)
    target: str = args.target
    script_args: list[str] = list(args.target_args)
    config = _is_config(target)
    if not args.k8s:  # in --k8s mode the path is inside the image
        _check_target_exists(target)
        if config:
            # a local launch's ranks skip train's own checks (they run under torchrun)
            local = not (args.slurm or args.k8s)
            nproc = args.nproc if args.nproc is not None else _default_nproc()
            _check_job(target, script_args, (nproc, args.nnodes) if local else None)
    if config:  # every rank runs `python -m gpu_training train CONFIG ARGS`
        script_args = ["train", target, *script_args]
    run_target = "gpu_training" if config else target
    if args.slurm:
        return _slurm(args, run_target, script_args, module=config)
    if args.k8s:
        return _k8s(args, run_target, script_args, module=config, config=target if config else None)
    return _local(args, run_target, script_args, module=config)


def _local(args: argparse.Namespace, target: str, script_args: list[str], *, module: bool) -> int:
    from gpu_training.launcher import TORCHRUN, launch_argv, launch_env, run_torchrun

    if args.nnodes > 1 and args.rdzv_endpoint is None:
        raise _usage("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (one of the nodes)")
    if args.rdzv_id is not None and args.rdzv_endpoint is None:
        raise _usage("--rdzv-id needs --rdzv-endpoint HOST:PORT")
    nproc = args.nproc if args.nproc is not None else _default_nproc()
    options: dict[str, Any] = {
        "nnodes": args.nnodes,
        "rdzv_endpoint": args.rdzv_endpoint,
        "rdzv_id": args.rdzv_id,
        "max_restarts": args.max_restarts,
        "module": module,
    }
    try:
        shown = launch_argv(target, nproc, script_args, program=TORCHRUN, **options)
        # The interpreter running us has torch; `torchrun` on PATH may belong to another one.
        program = (sys.executable, "-m", "torch.distributed.run")
        argv = launch_argv(target, nproc, script_args, program=program, **options)
    except ValueError as err:
        raise _usage(_flag_names(str(err))) from None
    env = launch_env(os.environ, nproc_per_node=nproc, restarts=bool(args.max_restarts))
    added = {k: v for k, v in env.items() if os.environ.get(k) != v}
    if args.print_only:
        lines = [f"export {k}={shlex.quote(v)}" for k, v in added.items()]
        if args.nnodes > 1:
            lines.append(f"# on each of the {args.nnodes} nodes (the same line everywhere):")
        print("\n".join([*lines, shlex.join(shown)]))
        return 0
    print(f"gpu-training launch: {shlex.join(shown)}", file=sys.stderr, flush=True)
    code = run_torchrun(argv, env)
    if code > 128:
        why = f"was stopped by a signal (exit code {code}); its workers were asked to save"
        print(f"gpu-training launch: the job {why}", file=sys.stderr, flush=True)
    elif code:
        why = f"failed (exit code {code}): torchrun's report above names the failed rank"
        print(f"gpu-training launch: the job {why}", file=sys.stderr, flush=True)
    return code


def _slurm(args: argparse.Namespace, target: str, script_args: list[str], *, module: bool) -> int:
    from gpu_training.launcher.slurm import sbatch_script, submit

    try:
        script = sbatch_script(
            target,
            script_args,
            nodes=args.nnodes,
            gpus_per_node=args.nproc,
            module=module,
            max_restarts=args.max_restarts,
            time=args.time,
            partition=args.partition,
            job_name=args.job_name or (Path(args.target).stem if module else None),
            port=args.port,
            cpus_per_node=args.cpus_per_node,
            gpu_request=args.gpu_request or "gpus-per-node",
        )
    except ValueError as err:
        raise _usage(_flag(str(err).split(" ", 1)[0]) + " " + str(err).split(" ", 1)[1]) from None
    if not args.submit:
        print(script, end="")
        return 0
    try:
        done = submit(script)
    except FileNotFoundError:
        raise _usage(
            "--submit: sbatch not found on PATH (not a SLURM login node?); drop --submit to "
            "print the script"
        ) from None
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    if done.returncode and "gres" in done.stderr.lower() and not args.gpu_request:
        print(
            "gpu-training launch: no GPUs on that partition? --gpu-request none leaves the GPU "
            "request out (--gpu-request gres writes --gres=gpu:N)",
            file=sys.stderr,
        )
    return done.returncode


def _k8s(
    args: argparse.Namespace,
    target: str,
    script_args: list[str],
    *,
    module: bool,
    config: str | None,
) -> int:
    from gpu_training.launcher.k8s import dns_name, pytorchjob_manifest, render_manifest

    name = args.name or dns_name(config or target)
    mount = args.checkpoint_mount or "/checkpoints"
    if config is not None and not any(
        a.startswith(("run.output_dir=", "checkpoint.dir=")) for a in script_args
    ):
        # Outputs (checkpoints included) on the claim: a restarted pod must find them.
        script_args = [*script_args, "--set", f"run.output_dir={mount.rstrip('/')}/{name}"]
    try:
        manifest = pytorchjob_manifest(
            target,
            script_args,
            name=name,
            nodes=args.nnodes,
            gpus_per_node=args.nproc,
            image=args.image,
            module=module,
            min_nodes=args.min_nodes,
            max_nodes=args.max_nodes,
            max_restarts=3 if args.max_restarts is None else args.max_restarts,
            restart_policy=args.restart_policy or "OnFailure",
            namespace=args.namespace,
            checkpoint_claim=args.checkpoint_claim,
            checkpoint_mount=mount,
            cpus_per_node=args.cpus_per_node,
        )
    except ValueError as err:
        field, _, rest = str(err).partition(" ")
        flag = {"nodes": "--nodes", "gpus_per_node": "--gpus-per-node"}.get(field, _flag(field))
        raise _usage(f"{flag} {rest}") from None
    print(render_manifest(manifest), end="")
    return 0


# --- launch-cmd: the torchrun command lines only -----------------------------------------


def register_launch_cmd(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Adds ``launch-cmd``: print the torchrun command line(s) of a launch, start nothing."""
    from gpu_training.commands.argtypes import non_negative_int, positive_int

    parser = subparsers.add_parser(
        "launch-cmd",
        help="print the torchrun command(s) for a launch",
        description=(
            "Print the torchrun command that launches SCRIPT, or one command per node when "
            "--nnodes > 1 (run line i on node i). Nothing is started."
        ),
    )
    parser.add_argument(
        "--nproc", type=positive_int, required=True, metavar="N", help="processes per node"
    )
    parser.add_argument("--nnodes", type=positive_int, default=1, metavar="M", help="nodes")
    parser.add_argument(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="rendezvous host:port of the rank-0 node (needed when --nnodes > 1)",
    )
    parser.add_argument(
        "--rdzv-id", metavar="ID", help="job id shared by all nodes (default: a random one)"
    )
    parser.add_argument(
        "--max-restarts",
        type=non_negative_int,
        metavar="K",
        help="restart the whole group up to K times when a worker fails",
    )
    parser.add_argument("script", metavar="SCRIPT", help="the training script")
    parser.add_argument(
        "script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for SCRIPT"
    )
    parser.set_defaults(_run=_run_launch_cmd)


# launcher messages name Python arguments; at the command line the user typed flags.
_LAUNCHER_FLAGS = {
    "nproc_per_node": "--nproc",
    "nproc": "--nproc",
    "nnodes": "--nnodes",
    "rdzv_endpoint": "--rdzv-endpoint",
    "rdzv_id": "--rdzv-id",
    "max_restarts": "--max-restarts",
    "script": "SCRIPT",
    "args": "ARGS",
}


def _flag_names(message: str) -> str:
    name = message.split(" ", 1)[0]
    flag = _LAUNCHER_FLAGS.get(name)
    return message if flag is None else flag + message[len(name) :]


def _run_launch_cmd(args: argparse.Namespace) -> int:
    from gpu_training.cli import UsageError
    from gpu_training.launcher import RESTART_ENV, multi_node_commands, single_node_command

    if args.nnodes > 1 and args.rdzv_endpoint is None:
        raise UsageError("launch-cmd: --nnodes > 1 needs --rdzv-endpoint HOST:PORT")
    if args.rdzv_id is not None and args.rdzv_endpoint is None:
        raise UsageError("launch-cmd: --rdzv-id needs --rdzv-endpoint HOST:PORT")
    try:
        if args.rdzv_endpoint is None:
            commands = [
                single_node_command(
                    args.script, args.nproc, args.script_args, max_restarts=args.max_restarts
                )
            ]
        else:
            commands = multi_node_commands(
                args.script,
                nnodes=args.nnodes,
                nproc_per_node=args.nproc,
                rdzv_endpoint=args.rdzv_endpoint,
                args=args.script_args,
                rdzv_id=args.rdzv_id,
                max_restarts=args.max_restarts,
            )
    except ValueError as err:
        raise UsageError(f"launch-cmd: {_flag_names(str(err))}") from None
    lines: list[str] = []
    if args.max_restarts is not None:
        # Restarts reuse the rendezvous store unless this is set: 5/12 recoveries vs 16/16.
        lines += [f"export {key}={value}" for key, value in RESTART_ENV.items()]
    if len(commands) == 1:
        lines.append(commands[0])
    else:
        for node, command in enumerate(commands):
            lines += [f"# node {node}:", command]
    print("\n".join(lines))
    return 0
