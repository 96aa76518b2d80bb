"""Kubernetes: the Kubeflow ``PyTorchJob`` manifest ``gpu-training launch --k8s`` writes."""

from __future__ import annotations

import doctest
import re
from typing import Any

import pytest
import yaml

import gpu_training.launcher.k8s as k8s_module
from gpu_training.cli import main
from gpu_training.launcher import RESTART_ENV, SIGNALS_TO_HANDLE
from gpu_training.launcher.k8s import RESTART_POLICIES, dns_name, pytorchjob_manifest

# What the training operator (kubeflow.org/v1) requires or reads for an elastic PyTorchJob:
# path -> check. From its validation (name a DNS-1035 label, a "Worker" or "Master" replica
# spec with containers, every container with an image, one named "pytorch", at most one
# Master; not both nprocPerNode and the deprecated elasticPolicy.nProcPerNode) and its
# elastic env generator (PET_NNODES from min/maxReplicas, PET_RDZV_ENDPOINT from the
# "pytorchjob-port" port or rdzvPort, PET_MAX_RESTARTS from maxRestarts).
_REQUIRED: dict[str, Any] = {
    "apiVersion": lambda v: v == "kubeflow.org/v1",
    "kind": lambda v: v == "PyTorchJob",
    "metadata.name": lambda v: re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", v) is not None,
    "spec.nprocPerNode": lambda v: isinstance(v, str) and v.isdigit(),
    "spec.elasticPolicy.rdzvBackend": lambda v: v in ("c10d", "etcd", "etcd-v2"),
    "spec.elasticPolicy.rdzvPort": lambda v: isinstance(v, int) and 0 < v < 65536,
    "spec.elasticPolicy.minReplicas": lambda v: isinstance(v, int) and v >= 1,
    "spec.elasticPolicy.maxReplicas": lambda v: isinstance(v, int) and v >= 1,
    "spec.elasticPolicy.maxRestarts": lambda v: isinstance(v, int) and v >= 0,
    "spec.runPolicy.cleanPodPolicy": lambda v: v in ("None", "Running", "All"),
    "spec.pytorchReplicaSpecs.Worker.replicas": lambda v: isinstance(v, int) and v >= 1,
    "spec.pytorchReplicaSpecs.Worker.restartPolicy": lambda v: v in RESTART_POLICIES,
    "spec.pytorchReplicaSpecs.Worker.template.spec.containers": lambda v: bool(v),
}


def _get(tree: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        assert isinstance(tree, dict) and key in tree, f"missing field {path}"
        tree = tree[key]
    return tree


def _check_kubeflow_fields(manifest: dict[str, Any]) -> dict[str, Any]:
    """Asserts the required fields; returns the "pytorch" container."""
    for path, ok in _REQUIRED.items():
        assert ok(_get(manifest, path)), f"{path} = {_get(manifest, path)!r}"
    spec = manifest["spec"]
    assert set(spec["pytorchReplicaSpecs"]) <= {"Master", "Worker"}
    assert "nProcPerNode" not in spec["elasticPolicy"]  # deprecated; refused next to nprocPerNode
    policy = spec["elasticPolicy"]
    replicas = spec["pytorchReplicaSpecs"]["Worker"]["replicas"]
    assert policy["minReplicas"] <= replicas <= policy["maxReplicas"]
    pod = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert all(c.get("image") for c in pod["containers"])
    (container,) = [c for c in pod["containers"] if c["name"] == "pytorch"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["pytorchjob-port"] == policy["rdzvPort"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert set(mounts) <= set(volumes)
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"]
    return container


def test_cli_manifest_parses_and_has_what_kubeflow_requires(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["launch", "--k8s", "--nodes", "2", "--gpus-per-node", "8", "--image", "reg/me:1"]
    argv += ["--min-nodes", "1", "--max-nodes", "4", "--max-restarts", "5"]
    argv += ["--restart-policy", "ExitCode", "--cpus-per-node", "32", "--namespace", "ml"]
    assert main([*argv, "train/My_Model.py", "--epochs", "3"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# Written by `gpu-training launch --k8s`")
    manifest = yaml.safe_load(text)
    container = _check_kubeflow_fields(manifest)
    assert manifest["metadata"] == {"name": "my-model", "namespace": "ml"}
    policy = manifest["spec"]["elasticPolicy"]
    assert (policy["minReplicas"], policy["maxReplicas"], policy["maxRestarts"]) == (1, 4, 5)
    assert policy["rdzvId"] == "my-model"
    assert manifest["spec"]["nprocPerNode"] == "8"
    worker = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert (worker["replicas"], worker["restartPolicy"]) == (2, "ExitCode")
    assert container["image"] == "reg/me:1"
    # nnodes / rendezvous / restarts come from the operator's PET_* variables, not flags
    assert container["command"] == [
        "torchrun",
        f"--signals-to-handle={SIGNALS_TO_HANDLE}",
        "train/My_Model.py",
        "--epochs",
        "3",
    ]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {**RESTART_ENV, "OMP_NUM_THREADS": "4"}
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 8}, "requests": {"cpu": 32}}
    pod = worker["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > 30  # torchrun's own SIGTERM grace is 30 s
    claim = {v["name"]: v for v in pod["volumes"]}["checkpoints"]["persistentVolumeClaim"]
    assert claim == {"claimName": "my-model-checkpoints"}


def test_cli_job_file_runs_train_with_outputs_on_the_claim(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["launch", "--k8s", "--nodes", "2", "--gpus-per-node", "4", "--image", "img:2"]
    argv += ["--checkpoint-claim", "shared", "--checkpoint-mount", "/ckpt"]
    assert main([*argv, "configs/ddp_config.yaml", "--set", "training.max_steps=9"]) == 0
    manifest = yaml.safe_load(capsys.readouterr().out)
    container = _check_kubeflow_fields(manifest)
    assert manifest["metadata"]["name"] == "ddp-config"
    assert container["command"][2:] == [
        "--module",
        "gpu_training",
        "train",
        "configs/ddp_config.yaml",
        "--set",
        "training.max_steps=9",
        "--set",
        "run.output_dir=/ckpt/ddp-config",  # a restarted pod finds the checkpoints
    ]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["checkpoints"] == "/ckpt"


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ([], "--k8s needs --image IMAGE"),
        (["--image", "i", "--name", "Bad_Name"], "--name must be a DNS-1035 label"),
        (["--image", "i", "--min-nodes", "3"], "--min-nodes must be <= nodes (2) <= max_nodes"),
        (["--image", "i", "--restart-policy", "Sometimes"], "--restart-policy"),
        (["--image", "i", "--checkpoint-mount", "ckpt"], "--checkpoint-mount must be"),
        (["--image", "bad image"], "--image must be a container image"),
    ],
)
def test_cli_bad_k8s_input(
    extra: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["launch", "--k8s", "--nodes", "2", "--gpus-per-node", "8", *extra, "train.py"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-training: error: launch: "), lines
    assert fragment in lines[0]


def test_dns_name_and_validation() -> None:
    assert dns_name("examples/Train_DDP.py") == "train-ddp"
    assert dns_name("2nd-run.py") == "nd-run"
    assert dns_name("___.py") == "train"
    assert len(dns_name("x" * 100 + ".py")) == 63
    with pytest.raises(ValueError, match=r"^nodes must be"):
        pytorchjob_manifest("t.py", name="a", nodes=0, gpus_per_node=1, image="i")
    with pytest.raises(ValueError, match=r"^args must be a list"):
        pytorchjob_manifest("t.py", "--x", name="a", nodes=1, gpus_per_node=1, image="i")


def test_module_doctests() -> None:
    assert doctest.testmod(k8s_module).failed == 0
