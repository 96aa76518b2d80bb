"""``gpu-training doctor``: a coherent report here, warnings on inconsistent GPU launches,
the bug-report environment (OS, CPU, this package and its extras), and the multi-node probe
across two torchrun agents on 127.0.0.1."""

from __future__ import annotations

import json
import platform
import re
import tempfile
import threading
from pathlib import Path

import pytest

import gpu_training
from dist_harness import REPO_ROOT, find_free_port, run_python
from gpu_training.cli import main
from gpu_training.diagnostics.doctor import (
    DoctorCheck,
    Facts,
    GpuInfo,
    exit_code,
    judge,
    run_doctor,
    visible_device_count,
)
from gpu_training.diagnostics.doctor.environment import EXTRAS, extra_versions, summary_line
from gpu_training.diagnostics.doctor.probe import probe_nodes
from gpu_training.diagnostics.doctor.report import FAIL, OK, WARN


def _by_name(checks: list[DoctorCheck]) -> dict[str, DoctorCheck]:
    return {c.name: c for c in checks}


def _gpu_box(cvd: str | None, count: int) -> Facts:
    env = {} if cvd is None else {"CUDA_VISIBLE_DEVICES": cvd}
    gpus = [GpuInfo(i, "NVIDIA H100 80GB HBM3", 79.1, "9.0") for i in range(count)]
    return Facts(
        python="3.11.7",
        torch="2.13.0+cu128",
        cuda_build="12.8",
        cuda_available=True,
        cudnn=91002,
        nccl="2.27.5",
        nccl_available=True,
        gpus=gpus,
        driver="570.86",
        bf16=True,
        cpus=64,
        interfaces=["lo", "eth0"],
        env=env,
    )


def test_cpu_machine_report_is_coherent_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--nproc", "2", "--checkpoint-dir", str(tmp_path / "ckpt")]) == 0
    summary, *out = capsys.readouterr().out.splitlines()
    assert summary.startswith(f"gpu-training {gpu_training.__version__} | torch ")
    names = [line.split()[1] for line in out[:-1] if line[:4] in ("OK  ", "WARN", "FAIL")]
    for expected in (
        "python",
        "torch",
        "cuda",
        "backends",
        "gpus",
        "nproc",
        "bf16",
        "cpu",
        "os",
        "interfaces",
        "variables",
        "package",
        "extras",
        "disk",
    ):
        assert expected in names, out
    assert all(line.split()[0] in (OK, WARN, FAIL) for line in out[:-1] if not line[0].isspace())
    assert out[-1].endswith("0 FAIL")
    assert str(tmp_path) in "\n".join(out)  # the nearest existing parent's free space


def test_json_output_in_a_fresh_process() -> None:
    proc = run_python(
        ["-m", "gpu_training", "doctor", "--json", "--checkpoint-dir", "."],
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is True
    assert {c["status"] for c in data["checks"]} <= {OK, WARN, FAIL}
    assert {"python", "torch", "gpus", "disk"} <= {c["name"] for c in data["checks"]}
    env = data["environment"]
    assert env["package"] == gpu_training.__version__
    assert env["os"]["kernel"] == platform.release() and env["os"]["system"] == platform.system()
    assert env["cpu"]["usable"] >= 1 and env["python"] == platform.python_version()
    assert env["extras"] == extra_versions()  # the same versions pip would print
    assert env["summary"].startswith(f"gpu-training {gpu_training.__version__} | torch ")


def test_extra_versions_agree_with_pip() -> None:
    """Read from metadata, nothing imported: the versions ``pip list`` reports, or None."""
    proc = run_python(["-m", "pip", "list", "--format", "json"], timeout=60, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    pip = {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(proc.stdout)}
    versions = extra_versions()
    assert list(versions) == list(EXTRAS)
    for name, dists in EXTRAS.items():
        found = [pip[d] for d in dists if d in pip]
        assert versions[name] == (found[0] if found else None), name
    assert versions["deepspeed"] is not None  # the Makefile installs every CPU-capable extra


def test_text_report_names_the_package_and_every_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--checkpoint-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    by_line = {line.split()[1]: line for line in text.splitlines() if line.startswith(OK)}
    assert f"gpu-training {gpu_training.__version__}" in by_line["package"]
    extras = by_line["extras"]
    for name, version in extra_versions().items():
        assert name in extras
        if version is not None:
            assert f"{name} {version}" in extras and f"{name} {version}" in text.splitlines()[0]
        else:
            assert re.search(rf"not installed: .*\b{re.escape(name)}\b", extras), name
    assert platform.release() in by_line["os"]


def test_extras_table_covers_every_optional_dependency() -> None:
    """Each package of pyproject's extras (but dev's tools) has its line in the report."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    known = {dist for dists in EXTRAS.values() for dist in dists}
    for extra, requirements in project["optional-dependencies"].items():
        if extra == "dev":
            continue
        for requirement in requirements:
            name = re.match(r"[A-Za-z0-9_.-]+", requirement)
            assert name is not None
            normal = name.group(0).lower().replace("_", "-")
            assert normal in known, f"extra '{extra}': {normal} is missing from doctor's EXTRAS"


def test_summary_line_and_environment_lines_from_facts() -> None:
    facts = _gpu_box(None, 2)
    facts.package, facts.system, facts.kernel, facts.machine = "0.1.0", "Linux", "6.8.0", "x86_64"
    facts.distro, facts.cpu_model, facts.cpu_count = "Ubuntu 24.04 LTS", "AMD EPYC 9654", 192
    facts.extras = {"deepspeed": "0.19.8", "wandb": None}
    assert summary_line(facts) == (
        "gpu-training 0.1.0 | torch 2.13.0+cu128 | CUDA 12.8 (2x NVIDIA H100 80GB HBM3, "
        "driver 570.86) | Linux 6.8.0 x86_64 | Python 3.11.7 | deepspeed 0.19.8"
    )
    checks = _by_name(judge(facts))
    assert checks["os"].value == "Linux 6.8.0 x86_64, Ubuntu 24.04 LTS"
    assert checks["cpu"].value == "64 of 192 usable core(s) (AMD EPYC 9654)"
    assert checks["package"].value == "gpu-training 0.1.0"
    assert checks["extras"].value == "deepspeed 0.19.8; not installed: wandb"


@pytest.mark.parametrize(
    ("cvd", "count", "nproc", "status", "words"),
    [
        ("0,1", 2, 4, WARN, "--nproc 4 but 2 GPU(s) visible (CUDA_VISIBLE_DEVICES=0,1)"),
        ("0,1,2,3", 4, 2, WARN, "GPUs 2..3 stay idle"),
        (None, 8, 8, OK, "8 processes, one per visible GPU"),
        ("2,3", 2, 2, OK, "one per visible GPU (CUDA_VISIBLE_DEVICES=2,3)"),
    ],
)
def test_nproc_against_visible_gpus(
    cvd: str | None, count: int, nproc: int, status: str, words: str
) -> None:
    check = _by_name(judge(_gpu_box(cvd, count), nproc=nproc))["nproc"]
    assert check.status == status and words in check.value, check
    if status == WARN:
        assert check.fix.startswith("use --nproc")


def test_gpu_verdicts() -> None:
    facts = _gpu_box(None, 2)
    checks = _by_name(judge(facts))
    assert checks["gpus"].value.startswith("2 visible (0: NVIDIA H100") and "driver 570.86" in (
        checks["gpus"].value
    )
    assert checks["cuda"].value == "CUDA 12.8, cuDNN 91002"
    assert "NCCL 2.27.5" in checks["backends"].value and checks["bf16"].status == OK
    facts.bf16 = False
    facts.gpus.append(GpuInfo(2, "Tesla V100-SXM2-32GB", 31.7, "7.0"))
    checks = _by_name(judge(facts))
    assert checks["bf16"].status == WARN and "fp16" in checks["bf16"].fix
    assert checks["gpu mix"].status == WARN
    old = _gpu_box(None, 1)
    old.torch = "2.4.1"
    assert _by_name(judge(old))["torch"].status == FAIL
    assert exit_code(judge(old)) == 1


def test_socket_variables_and_interfaces() -> None:
    facts = _gpu_box(None, 1)
    facts.interfaces = ["lo", "eth0", "ib0"]
    facts.env = {"NCCL_SOCKET_IFNAME": "ens5", "GLOO_SOCKET_IFNAME": "^lo"}
    checks = _by_name(judge(facts))
    assert checks["NCCL_SOCKET_IFNAME"].status == FAIL and "lo, eth0, ib0" in (
        checks["NCCL_SOCKET_IFNAME"].value
    )
    assert checks["GLOO_SOCKET_IFNAME"].value == "'^lo' -> eth0, ib0"
    facts.env = {"NCCL_SOCKET_IFNAME": "=lo"}
    assert _by_name(judge(facts, nnodes=2))["NCCL_SOCKET_IFNAME"].status == FAIL
    facts.env = {}
    assert _by_name(judge(facts, nnodes=2))["NCCL_SOCKET_IFNAME"].status == WARN
    assert visible_device_count("0,1,-1,3") == 2


def test_rendezvous_and_disk(tmp_path: Path) -> None:
    port = find_free_port()
    ok = _by_name(run_doctor(rdzv_endpoint=f"127.0.0.1:{port}", checkpoint_dir=str(tmp_path)))
    assert ok["rendezvous"].status == OK and "port" in ok["rendezvous"].value
    unknown = _by_name(run_doctor(rdzv_endpoint="no-such-host.invalid:29500", checkpoint_dir=None))
    assert (
        unknown["rendezvous"].status == FAIL and "does not resolve" in unknown["rendezvous"].value
    )
    full = _by_name(run_doctor(checkpoint_dir=str(tmp_path), min_free_gib=1e9))
    assert full["disk"].status == WARN


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--nnodes", "2"], "--nnodes > 1 needs --rdzv-endpoint"),
        (["--rdzv-endpoint", "head-node"], "--rdzv-endpoint: rdzv_endpoint must be 'host:port'"),
        (["--nproc", "0"], "expected an integer >= 1"),
        (["--rdzv-id", "x"], "--rdzv-id names the multi-node probe"),
    ],
)
def test_bad_input_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu-training: error: ") and needle in err[0], err


@pytest.mark.multirank
def test_multi_node_probe_two_agents_on_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two probes, as ``doctor --nnodes 2`` runs them on two nodes, rendezvous on 127.0.0.1.

    Each call starts its own torchrun agent (one node each); threads stand in for the nodes.
    Nothing is left in the temp directory (torchrun's own log directory is ``torchelastic_*``).
    """
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    endpoint = f"127.0.0.1:{find_free_port()}"
    results: dict[int, list[DoctorCheck]] = {}

    def node(i: int) -> None:
        results[i] = probe_nodes(nnodes=2, nproc=1, rdzv_endpoint=endpoint, timeout=90)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(results) == [0, 1]
    for checks in results.values():
        by_name = _by_name(checks)
        assert [c.status for c in checks] == [OK, OK, OK], checks
        assert by_name["nodes"].value.startswith("2 ranks joined from 1 host(s)")
        assert by_name["versions"].value.startswith("identical on every rank: python")
        assert "result correct" in by_name["all_reduce"].value
    assert list(tmp_path.iterdir()) == []


def test_probe_reports_a_node_that_never_joins() -> None:
    checks = probe_nodes(
        nnodes=2, nproc=1, rdzv_endpoint=f"127.0.0.1:{find_free_port()}", timeout=3
    )
    assert checks[0].status == FAIL and checks[0].name == "nodes"
    assert "same doctor command on all 2 nodes" in checks[0].fix or "failed" in checks[0].value


@pytest.mark.requires_cuda
def test_gpu_machine_warns_on_inconsistent_visible_devices() -> None:
    """On a GPU machine: one visible GPU and --nproc 2 is a warning, not a crash."""
    proc = run_python(
        ["-m", "gpu_training", "doctor", "--nproc", "2", "--json", "--checkpoint-dir", "."],
        timeout=60,
        cwd=REPO_ROOT,
        env={"CUDA_VISIBLE_DEVICES": "0"},
    )
    assert proc.returncode == 0, proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["nproc"]["status"] == WARN and "1 GPU(s) visible" in checks["nproc"]["value"]
