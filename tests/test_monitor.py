"""gpu_training.monitor and ``gpu-training monitor``, on recorded nvidia-smi CSV and NVML values.

Fixtures (tests/fixtures/monitor/): ``<case>.csv`` is ``nvidia-smi --query-gpu=<GPU_FIELDS>
--format=csv,nounits`` output of an 8 x H100 node (healthy.csv keeps its header line, the others
are ``noheader``), ``<case>_apps.csv`` the matching ``--query-compute-apps`` output, and
``nvml_*.json`` the values a 4 x A100 node's NVML returns, replayed by a fake ``pynvml``.
Each anomaly rule must fire on the fixture that has the problem, on the right GPUs, and stay
silent on the healthy node.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpu_training.cli import main
from gpu_training.commands.monitor import EXIT_NO_GPU
from gpu_training.monitor import (
    GPUProcess,
    GPUState,
    NoGPUError,
    detect_anomalies,
    parse_apps_csv,
    parse_gpu_csv,
    query_gpus,
    query_nvidia_smi,
    query_nvml,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "monitor"


def load(case: str) -> list[GPUState]:
    states = parse_gpu_csv((FIXTURES / f"{case}.csv").read_text())
    apps = FIXTURES / f"{case}_apps.csv"
    if apps.exists():
        procs = parse_apps_csv(apps.read_text())
        states = [GPUState(**{**s.__dict__, "processes": procs.get(s.uuid, ())}) for s in states]
    return states


def fired(states: list[GPUState]) -> set[tuple[str, str, tuple[int, ...]]]:
    return {(a.rule, a.severity, a.gpus) for a in detect_anomalies(states)}


# --- parsing ------------------------------------------------------------------------------


def test_parse_csv_with_header_units_and_not_available_values() -> None:
    healthy = load("healthy")
    assert [s.index for s in healthy] == list(range(8))
    gpu0 = healthy[0]
    assert gpu0.name == "NVIDIA H100 80GB HBM3"
    assert gpu0.memory_used == 61234 * 2**20 and gpu0.memory_total == 81559 * 2**20
    assert (gpu0.utilization_gpu, gpu0.power_draw_w, gpu0.power_limit_w) == (97.0, 612.45, 700.0)
    assert gpu0.throttle_reasons == 0 and gpu0.throttle_names == ()
    assert gpu0.processes == (GPUProcess(40211, "/usr/bin/python3", 60500 * 2**20),)
    ecc = load("ecc")
    assert (ecc[4].ecc_corrected, ecc[4].ecc_uncorrected) == (None, None)  # [N/A]: ECC off
    assert (ecc[0].ecc_uncorrected, ecc[7].ecc_corrected) == (2, 14)
    thermal = load("thermal")
    assert thermal[2].throttle_reasons == 0x40 and thermal[2].throttle_names == (
        "hw_thermal_slowdown",
    )
    with pytest.raises(ValueError, match="15"):
        parse_gpu_csv("0, GPU-x, name, 3")


def test_summary_line() -> None:
    line = load("healthy")[0].summary_line()
    assert line == (
        "GPU 0 NVIDIA H100 80GB HBM3 | util  97% | mem 59.8/79.6 GiB ( 75%) | 60°C | 612/700 W "
        "| 1 proc"
    )
    assert "throttled: hw_thermal_slowdown" in load("thermal")[2].summary_line()
    assert GPUState(3, "T4").summary_line() == "GPU 3 T4"  # nothing known, nothing printed


# --- the rules ----------------------------------------------------------------------------


def test_healthy_node_is_silent() -> None:
    assert detect_anomalies(load("healthy")) == []


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "memory_full",
            {
                ("memory_near_full", "warning", (3,)),
                ("memory_near_full", "critical", (5,)),
            },
        ),
        (
            "thermal",
            {("thermal_throttle", "critical", (2,)), ("thermal_throttle", "warning", (6,))},
        ),
        ("power", {("power_throttle", "warning", (1,)), ("power_throttle", "critical", (4,))}),
        ("ecc", {("ecc_errors", "critical", (0,)), ("ecc_errors", "warning", (7,))}),
        ("straggler", {("utilization_imbalance", "warning", (3,))}),
        ("all_on_gpu0", {("all_on_gpu0", "critical", (0,))}),
        ("stray_contexts", {("all_on_gpu0", "warning", (0,))}),
        ("idle", {("idle_gpus", "warning", (4, 5, 6, 7))}),
    ],
)
def test_each_rule_fires_on_its_fixture_and_nothing_else(
    case: str, expected: set[tuple[str, str, tuple[int, ...]]]
) -> None:
    states = load(case)
    assert fired(states) == expected
    anomalies = detect_anomalies(states)
    assert [a.severity for a in anomalies] == sorted(
        (a.severity for a in anomalies), key=["critical", "warning", "info"].index
    )
    for a in anomalies:
        assert a.message and all(f"GPU {i}" in a.message or f"{i}" in a.message for i in a.gpus)


def test_rule_messages_name_the_cause() -> None:
    text = {a.rule: a.message for a in detect_anomalies(load("all_on_gpu0"))}
    assert "torch.cuda.set_device(local_rank)" in text["all_on_gpu0"]
    text = {a.rule: a.message for a in detect_anomalies(load("straggler"))}
    assert "GPU 3 at 35%" in text["utilization_imbalance"]
    hot = detect_anomalies(load("thermal"))[0]  # critical first: GPU 2
    assert "92°C" in hot.message and "1410 of 1980 MHz" in hot.message


def test_rules_without_process_information() -> None:
    # No process list (some containers): GPU 0 pile-up cannot be judged and stays silent;
    # idle GPUs and imbalance fall back to memory use.
    states = [GPUState(**{**s.__dict__, "processes": None}) for s in load("all_on_gpu0")]
    assert {r for r, _, _ in fired(states)} == {"idle_gpus"}
    states = [GPUState(**{**s.__dict__, "processes": None}) for s in load("straggler")]
    assert {r for r, _, _ in fired(states)} == {"utilization_imbalance"}
    assert detect_anomalies([load("thermal")[0]]) == []  # one healthy GPU: nothing to compare


# --- NVML ---------------------------------------------------------------------------------


class FakeNVML:
    """The pynvml functions the monitor calls, answering from a recorded JSON fixture."""

    class NVMLError(Exception):
        pass

    def __init__(self, fixture: str) -> None:
        self.devices = json.loads((FIXTURES / fixture).read_text())["devices"]
        self.calls: list[str] = []

    def _dev(self, handle: int) -> dict[str, Any]:
        return dict(self.devices[handle])

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self._dev(h)["name"].encode()  # older pynvml returns bytes

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return str(self._dev(h)["uuid"])

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(**self._dev(h)["utilization"])

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(**self._dev(h)["memory"])

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return int(self._dev(h)["temperature"])

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return int(self._dev(h)["power_mw"])

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return int(self._dev(h)["power_limit_mw"])

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return int(self._dev(h)["sm_clock"])

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        return int(self._dev(h)["max_sm_clock"])

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return int(self._dev(h)["throttle_reasons"])

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        ecc = self._dev(h)["ecc"]
        if ecc is None:
            raise self.NVMLError("Not Supported")
        return int(ecc["uncorrected" if kind == 1 else "corrected"])

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used_memory"])
            for p in self._dev(h)["processes"]
        ]


def test_nvml_values_become_states() -> None:
    nvml = FakeNVML("nvml_healthy.json")
    states = query_nvml(nvml)
    assert nvml.calls == ["init", "shutdown"]
    assert len(states) == 4 and states[1].name == "NVIDIA A100-SXM4-80GB"
    s = states[1]
    assert (s.power_draw_w, s.power_limit_w, s.memory_used) == (351.0, 400.0, 60 * 2**30)
    assert s.processes is not None and s.processes[0].pid == 5010
    assert detect_anomalies(states) == []


def test_nvml_problems_fire_and_unsupported_values_are_none() -> None:
    states = query_gpus(FakeNVML("nvml_problems.json"))
    assert (states[3].ecc_corrected, states[3].ecc_uncorrected) == (None, None)
    assert fired(states) == {
        ("thermal_throttle", "critical", (0,)),
        ("ecc_errors", "critical", (0,)),
        ("utilization_imbalance", "warning", (2,)),
    }


class BrokenNVML(FakeNVML):
    def __init__(self) -> None:
        super().__init__("nvml_healthy.json")

    def nvmlInit(self) -> None:
        raise self.NVMLError("Driver Not Loaded")


def _fake_smi(directory: Path, *, old_driver: bool = False) -> Path:
    """An ``nvidia-smi`` that prints the idle fixture; ``old_driver`` rejects the throttle
    field's old name, as a driver that only knows ``clocks_event_reasons`` would."""
    script = directory / "nvidia-smi"
    gpu_csv = (FIXTURES / "idle.csv").read_text()
    apps_csv = (FIXTURES / "idle_apps.csv").read_text()
    reject = "clocks_throttle_reasons" if old_driver else "no-such-field"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "args = ' '.join(sys.argv[1:])\n"
        f"if {reject!r} in args:\n"
        f"    print('Field \"{reject}.active\" is not a valid field to query.'); sys.exit(2)\n"
        f"print({apps_csv!r} if '--query-compute-apps' in args else {gpu_csv!r}, end='')\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.mark.parametrize("old_driver", [False, True])
def test_query_gpus_falls_back_to_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old_driver: bool
) -> None:
    _fake_smi(tmp_path, old_driver=old_driver)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    states = query_gpus(BrokenNVML())
    assert len(states) == 8 and states[0].processes is not None
    assert fired(states) == {("idle_gpus", "warning", (4, 5, 6, 7))}
    assert query_nvidia_smi() == states


def test_no_gpu_error_names_both_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    with pytest.raises(NoGPUError, match=r"no NVIDIA GPU found \(NVML: .*nvidia-smi: not found"):
        query_gpus(BrokenNVML())


# --- the command --------------------------------------------------------------------------


def test_monitor_once_replays_a_fixture(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["monitor", "--once", "--replay", str(FIXTURES / "all_on_gpu0.csv")]
    assert main([*argv, "--replay-apps", str(FIXTURES / "all_on_gpu0_apps.csv")]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H100" in out and "[critical] all 4 processes are on GPU 0" in out
    assert main(["monitor", "--once", "--replay", str(FIXTURES / "healthy.csv")]) == 0
    assert "no anomalies" in capsys.readouterr().out


def test_monitor_json_and_count(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["monitor", "--json", "--count", "2", "--interval", "0.01"]
    assert main([*argv, "--replay", str(FIXTURES / "thermal.csv")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    snapshot = json.loads(lines[0])
    assert len(snapshot["gpus"]) == 8 and snapshot["gpus"][2]["throttle_names"] == [
        "hw_thermal_slowdown"
    ]
    assert [a["rule"] for a in snapshot["anomalies"]] == ["thermal_throttle"] * 2


def test_monitor_without_gpu_fails_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A health check runs `monitor --once`: no GPU must not read as success (exit 0)."""
    import gpu_training.monitor as monitor

    def no_gpu(nvml: Any = None) -> list[GPUState]:
        raise NoGPUError("no NVIDIA GPU found (NVML: not installed; nvidia-smi: not found)")

    monkeypatch.setattr(monitor, "query_gpus", no_gpu)
    for argv in (["--once"], ["--count", "3", "--interval", "0.01"], []):
        assert main(["monitor", *argv]) == EXIT_NO_GPU == 1
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err == (
            "gpu-training: monitor: no NVIDIA GPU found (NVML: not installed; "
            "nvidia-smi: not found)\n"
        )
    assert main(["monitor", "--once", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["gpus"] == [] and document["message"].startswith("no NVIDIA GPU found")


def test_monitor_replay_without_gpus_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header = (FIXTURES / "healthy.csv").read_text().splitlines()[0]
    for text in ("", header + "\n"):
        replay = tmp_path / "none.csv"
        replay.write_text(text)
        assert main(["monitor", "--once", "--replay", str(replay)]) == 1
        assert (
            capsys.readouterr().err == f"gpu-training: monitor: no NVIDIA GPU listed in {replay}\n"
        )


def test_monitor_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--help"]) == 0
    text = capsys.readouterr().out
    epilog = text[text.index("exit status:") :].splitlines()
    codes = [line.split()[0] for line in epilog[1:] if line[:3].strip()]
    assert codes == ["0", "1", "2"]
    assert "exits 1" in text and "no GPU to report on" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replay", "/nonexistent/gpus.csv"], "cannot read /nonexistent/gpus.csv"),
        (["--replay-apps", "x.csv"], "--replay-apps needs --replay"),
        (["--interval", "0"], "expected seconds > 0"),
    ],
)
def test_monitor_bad_input_is_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["monitor", "--once", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpu-training: error:") and message in err


def test_monitor_module_imports_no_torch() -> None:
    import subprocess

    code = "import sys, gpu_training.monitor; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
