"""Write the Kubeflow ``PyTorchJob`` manifest of an elastic torchrun job on Kubernetes.

The Kubeflow training operator (``kubeflow.org/v1``) creates one pod per node, each running
``torchrun``; with an ``elasticPolicy`` it passes the rendezvous (c10d on the first worker
pod), the node range and the restart budget to torchrun as ``PET_*`` environment variables,
so the container's command names only the script. A ``persistentVolumeClaim`` holds the
checkpoints, so a restarted pod (or group) resumes from them. It imports no torch.

Example:
    >>> m = pytorchjob_manifest("train.py", ["--epochs", "3"], name="llm", nodes=2,
    ...                         gpus_per_node=8, image="registry/llm:1", max_restarts=3)
    >>> m["kind"], m["spec"]["elasticPolicy"]["rdzvBackend"], m["spec"]["nprocPerNode"]
    ('PyTorchJob', 'c10d', '8')
    >>> m["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    ['torchrun', '--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1', 'train.py', \
'--epochs', '3']
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from gpu_training.config.checks import check_int_argument
from gpu_training.launcher import RESTART_ENV, SIGNALS_TO_HANDLE

__all__ = ["RDZV_PORT", "RESTART_POLICIES", "dns_name", "pytorchjob_manifest", "render_manifest"]

RDZV_PORT = 29400
"""The c10d rendezvous port on the first worker pod (torchrun's default)."""

RESTART_POLICIES: tuple[str, ...] = ("OnFailure", "ExitCode", "Always", "Never")
"""Pod restart policies the operator accepts. ``ExitCode`` restarts pods that exited with a
signal's code (128+N: preemption, eviction, OOM kill) and fails the job on a code 1-127."""

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_GRACE_S = 60  # torchrun gives workers 30 s after SIGTERM; the pod must outlive that


def dns_name(text: str) -> str:
    """``text`` made into a Kubernetes object name (DNS-1035 label: ``[a-z][-a-z0-9]*``, <= 63).

    Args:
        text: Any string, e.g. a script's file name.

    Returns:
        The name; ``"train"`` when nothing usable is left.

    Example:
        >>> dns_name("examples/Train_DDP.py")
        'train-ddp'
    """
    stem = os.path.splitext(os.path.basename(text))[0].lower()
    name = re.sub(r"[^a-z0-9]+", "-", stem).strip("-")
    name = re.sub(r"^[^a-z]+", "", name)[:63].rstrip("-")
    return name or "train"


def pytorchjob_manifest(
    target: str,
    args: Sequence[str] = (),
    *,
    name: str,
    nodes: int,
    gpus_per_node: int,
    image: str,
    module: bool = False,
    min_nodes: int | None = None,
    max_nodes: int | None = None,
    max_restarts: int = 3,
    restart_policy: str = "OnFailure",
    namespace: str | None = None,
    checkpoint_claim: str | None = None,
    checkpoint_mount: str = "/checkpoints",
    cpus_per_node: int | None = None,
    gpu_resource: str = "nvidia.com/gpu",
) -> dict[str, Any]:
    """The ``PyTorchJob`` (``kubeflow.org/v1``) of an elastic torchrun job, as a dict.

    Args:
        target: The script inside the image (or a module with ``module=True``).
        args: Its arguments, one string each.
        name: The job's name, a DNS-1035 label (see :func:`dns_name`); also the rendezvous id.
        nodes: Worker pods to start (one torchrun agent each).
        gpus_per_node: GPUs, and worker processes, per pod.
        image: The container image, holding the code and its Python environment.
        module: Run ``python -m target`` instead of a script.
        min_nodes: The fewest pods to keep training with (default: ``nodes``).
        max_nodes: The most pods to scale to (default: ``nodes``).
        max_restarts: Group restarts (failures and membership changes) before giving up.
        restart_policy: One of :data:`RESTART_POLICIES`.
        namespace: The namespace; None leaves it to ``kubectl``'s context.
        checkpoint_claim: The ``PersistentVolumeClaim`` mounted at ``checkpoint_mount``;
            None uses ``<name>-checkpoints`` (create it first: ReadWriteMany when several
            pods write).
        checkpoint_mount: Where checkpoints live inside the pods.
        cpus_per_node: CPUs to request per pod; also sets ``OMP_NUM_THREADS`` to an even share.
        gpu_resource: The extended resource name of a GPU.

    Returns:
        The manifest, ready for :func:`render_manifest`.

    Raises:
        ValueError: If an argument is invalid; the message names it.
    """
    if not isinstance(name, str) or not _DNS_1035.fullmatch(name):
        raise ValueError(
            f"name must be a DNS-1035 label (lowercase letters, digits and '-', starting with "
            f"a letter, at most 63 characters), got {name!r}"
        )
    check_int_argument("nodes", nodes)
    check_int_argument("gpus_per_node", gpus_per_node)
    low = nodes if min_nodes is None else check_int_argument("min_nodes", min_nodes)
    high = nodes if max_nodes is None else check_int_argument("max_nodes", max_nodes)
    if not low <= nodes <= high:
        raise ValueError(f"min_nodes must be <= nodes ({nodes}) <= max_nodes, got {low} and {high}")
    check_int_argument("max_restarts", max_restarts, 0)
    if restart_policy not in RESTART_POLICIES:
        raise ValueError(
            f"restart_policy must be one of {', '.join(RESTART_POLICIES)}, got {restart_policy!r}"
        )
    if not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image):
        raise ValueError(f"image must be a container image reference, got {image!r}")
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"target must be a script path or module name, got {target!r}")
    if isinstance(args, (str, bytes)) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"args must be a list of strings, got {args!r}")
    if not checkpoint_mount.startswith("/"):
        raise ValueError(f"checkpoint_mount must be an absolute path, got {checkpoint_mount!r}")
    claim = checkpoint_claim or f"{name}-checkpoints"

    env = [{"name": key, "value": value} for key, value in RESTART_ENV.items()]
    resources: dict[str, Any] = {"limits": {gpu_resource: gpus_per_node}}
    if cpus_per_node is not None:
        check_int_argument("cpus_per_node", cpus_per_node)
        threads = max(1, cpus_per_node // gpus_per_node)
        env.append({"name": "OMP_NUM_THREADS", "value": str(threads)})
        resources["requests"] = {"cpu": cpus_per_node}
    # nnodes, nproc, rendezvous and max restarts come from the operator's PET_* variables.
    command = ["torchrun", f"--signals-to-handle={SIGNALS_TO_HANDLE}"]
    command += ["--module", target] if module else [target]
    container = {
        "name": "pytorch",  # the operator looks for a container of this name
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": [*command, *args],
        "env": env,
        "ports": [{"name": "pytorchjob-port", "containerPort": RDZV_PORT}],
        "resources": resources,
        "volumeMounts": [
            {"name": "checkpoints", "mountPath": checkpoint_mount},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        if not _DNS_1035.fullmatch(namespace) and not re.fullmatch(r"[a-z0-9-]{1,63}", namespace):
            raise ValueError(f"namespace must be a DNS label, got {namespace!r}")
        metadata["namespace"] = namespace
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": metadata,
        "spec": {
            "nprocPerNode": str(gpus_per_node),
            "elasticPolicy": {
                "rdzvBackend": "c10d",
                "rdzvPort": RDZV_PORT,
                "rdzvId": name,
                "minReplicas": low,
                "maxReplicas": high,
                "maxRestarts": max_restarts,
            },
            "runPolicy": {"cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": nodes,
                    "restartPolicy": restart_policy,
                    "template": {
                        "spec": {
                            # SIGTERM first: torchrun forwards it, workers checkpoint and exit.
                            "terminationGracePeriodSeconds": _GRACE_S,
                            "containers": [container],
                            "volumes": [
                                {
                                    "name": "checkpoints",
                                    "persistentVolumeClaim": {"claimName": claim},
                                },
                                # the default 64 MB /dev/shm starves DataLoader workers and NCCL
                                {"name": "dshm", "emptyDir": {"medium": "Memory"}},
                            ],
                        }
                    },
                }
            },
        },
    }


def render_manifest(manifest: dict[str, Any]) -> str:
    """``manifest`` as YAML for ``kubectl apply -f -``, with a header saying what it needs.

    Args:
        manifest: A dict from :func:`pytorchjob_manifest`.

    Returns:
        The YAML text.

    Example:
        >>> text = render_manifest(pytorchjob_manifest("t.py", name="demo", nodes=1,
        ...                                            gpus_per_node=1, image="img:1"))
        >>> text.splitlines()[3]
        'apiVersion: kubeflow.org/v1'
    """
    import yaml

    claim = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"][0]
    header = [
        "# Written by `gpu-training launch --k8s`. Needs the Kubeflow training operator and the",
        f"# PersistentVolumeClaim {claim['persistentVolumeClaim']['claimName']!r} (checkpoints).",
        "# Apply with: kubectl apply -f THIS_FILE",
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump(manifest, sort_keys=False)
