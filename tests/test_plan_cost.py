"""Time and cost in ``gpu-training plan``: the model's arithmetic, published runs, the CLI.

The published runs that the compute estimate is checked against (at the default MFU, 40%,
on the GPU table's dense bf16 peaks), each within ±25%:

- Llama 2 7B (Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models",
  arXiv:2307.09288): 2.0T tokens at 4k context (Table 1) in 184,320 A100-80GB GPU-hours
  (Table 2): 3,014 tokens/s per GPU. Estimated: 2,708 (-10%); the paper's run implies 44.5%.
- Llama 3.1 8B with torchtitan (pytorch/torchtitan, docs/performance.md, Table 1): FSDP on
  8 H100, bf16, local batch 2 at 8,192 tokens, no torch.compile: 5,762 tokens/s per GPU.
  Estimated: 6,834 (+19%); the run implies 33.7% of the H100 SXM peak (torchtitan's H100s
  ran at 500 W, so below it).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_training.cli import main
from gpu_training.cost import (
    TrainingRun,
    collective_seconds,
    compute_tokens_per_s,
    run_cost,
    shape_flops_per_token,
    step_time,
)
from gpu_training.hardware import DEFAULT_MFU, GPU_TYPES, HardwareError, gpu_spec, load_hardware
from gpu_training.memory import TransformerShape

REPO = Path(__file__).resolve().parents[1]
LLAMA_7B = [
    *("--params", "7e9", "--layers", "32", "--hidden", "4096", "--seq", "4096"),
    *("--vocab", "32000", "--arch", "llama"),
]
# The issue's command: a 7B model, 10B tokens on one node of 8 H100.
ISSUE = [*LLAMA_7B, "--gpu-memory", "80", "--gpus", "8", "--global-batch", "256"]
ISSUE += ["--tokens", "1e10", "--gpu-type", "h100"]
GPT2 = ["--params", "124M", "--layers", "12", "--hidden", "768", "--seq", "1024"]
GPT2_NODE = [*GPT2, "--gpu-memory", "80", "--gpus", "8", "--global-batch", "512"]
STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "zero3_offload")


def plan(argv: list[str]) -> tuple[int, str, str]:
    """``gpu-training plan ARGV`` in-process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", *argv])
    return code, out.getvalue(), err.getvalue()


def plan_json(argv: list[str]) -> dict[str, Any]:
    code, out, err = plan([*argv, "--json"])
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


@pytest.fixture(scope="module")
def issue_text() -> str:
    code, out, err = plan(ISSUE)
    assert code == 0, err
    return out


@pytest.fixture(scope="module")
def issue_json() -> dict[str, Any]:
    return plan_json(ISSUE)


# --- published runs ------------------------------------------------------------------------


def within(estimate: float, published: float, tolerance: float = 0.25) -> bool:
    return abs(estimate / published - 1) <= tolerance


def test_llama2_7b_gpu_hours_on_a100_match_the_paper() -> None:
    """Llama 2 paper: 184,320 A100-80GB GPU-hours for 2.0T tokens of the 7B model."""
    published_gpu_hours, tokens = 184_320, 2 * 10**12
    published = tokens / (published_gpu_hours * 3600)  # 3,014 tokens/s per GPU
    shape = TransformerShape(32, 4096, 4096, vocab_size=32000, arch="llama")
    a100 = gpu_spec("a100-80gb")
    assert DEFAULT_MFU == a100.mfu == 0.40  # the MFU this check assumes
    estimate = compute_tokens_per_s(shape.flops_per_token(), a100)
    assert round(published) == 3014 and round(estimate) == 2708
    assert within(estimate, published)


def test_llama2_7b_through_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """The whole plan for the paper's run: 4M-token batches (1,024 x 4,096) on 1,024 A100s
    over 128 nodes; FSDP's communication hides under compute, so the GPU-hours are the
    compute's, within ±25% of the paper's 184,320."""
    argv = [*LLAMA_7B[:1], "6.74e9", *LLAMA_7B[2:], "--gpu-memory", "80", "--gpus", "1024"]
    argv += ["--global-batch", "1024", "--gpu-type", "a100-80gb", "--tokens", "2T"]
    argv += ["--activation-checkpointing", "off"]
    t = plan_json(argv)["time"]
    assert t["nodes"] == 128 and t["tokens_per_step"] == 1024 * 4096
    fsdp = t["strategies"]["fsdp"]
    assert fsdp["exposed_s"] == 0 and fsdp["fits"]
    assert within(fsdp["gpu_hours"], 184_320)
    assert 200_000 < fsdp["gpu_hours"] < 210_000  # 2T x 46.1 GFLOP / (312 T x 40%)
    assert fsdp["dollars"] == pytest.approx(fsdp["gpu_hours"] * 1.20)  # $9.60 / 8 GPUs


def test_llama31_8b_on_h100_matches_torchtitan() -> None:
    """torchtitan docs/performance.md, Table 1: Llama 3.1 8B, FSDP, 8 H100, local batch 2,
    sequence 8192, bf16, no torch.compile: 5,762 tokens/s per GPU."""
    shape = TransformerShape(
        32,
        4096,
        8192,
        num_heads=32,
        vocab_size=128256,
        ffn_hidden_size=14336,
        num_kv_heads=8,
        arch="llama",
    )
    assert round(shape.num_params() / 1e9, 2) == 8.03
    h100 = gpu_spec("h100")
    estimate = compute_tokens_per_s(shape.flops_per_token(), h100)  # at MFU 0.40
    assert round(estimate) == 6834
    assert within(estimate, 5762)
    # With the step's communication: 8 GPUs, batch 2 x 8192 per GPU, no accumulation.
    run = TrainingRun(
        num_params=shape.num_params(),
        flops_per_token=shape.flops_per_token(),
        tokens_per_sample=8192,
        micro_batch=2,
        num_gpus=8,
    )
    step = step_time(run, h100, "fsdp")
    assert within(step.tokens_per_s / 8, 5762)


# --- the arithmetic ------------------------------------------------------------------------


def test_collectives_are_rings_hierarchical_over_nodes() -> None:
    h100 = gpu_spec("h100")
    size = 10e9
    one_node = collective_seconds("all_gather", size, 8, 8, h100)
    assert one_node == pytest.approx(7 / 8 * size / 450e9)  # (N-1)/N x bytes / link
    assert collective_seconds("all_reduce", size, 8, 8, h100) == pytest.approx(2 * one_node)
    two_nodes = collective_seconds("reduce_scatter", size, 16, 8, h100)
    assert two_nodes == pytest.approx(one_node + 1 / 2 * size / 8 / 50e9)
    assert collective_seconds("all_reduce", size, 1, 8, h100) == 0
    with pytest.raises(ValueError, match="all_gather"):
        collective_seconds("broadcast", size, 8, 8, h100)


def _run(**change: Any) -> TrainingRun:
    fields: dict[str, Any] = {
        "num_params": 7_000_000_000,
        "flops_per_token": 4.6e10,
        "tokens_per_sample": 4096,
        "micro_batch": 1,
        "accumulation": 4,
        "num_gpus": 8,
    }
    return TrainingRun(**{**fields, **change})


def test_compute_is_flops_over_peak_times_mfu() -> None:
    h100 = gpu_spec("h100")
    step = step_time(_run(), h100, "ddp")
    per_micro = 4096 * 4.6e10 / (989.4e12 * 0.40)
    assert step.compute_s == pytest.approx(4 * per_micro)
    assert step_time(_run(), h100, "ddp", mfu=0.5).compute_s == pytest.approx(4 * per_micro * 0.8)
    recompute = step_time(_run(activation_checkpointing=True), h100, "ddp")
    assert recompute.compute_s == pytest.approx(step.compute_s * 4 / 3)  # a second forward
    assert step_time(_run(precision="fp32"), h100, "ddp").compute_s == pytest.approx(
        2 * step.compute_s  # TF32 at half the bf16 rate
    )


def test_ddp_reduces_once_per_step_and_hides_under_the_last_backward() -> None:
    slow = gpu_spec("rtx4090")  # 32 GB/s PCIe: the 28 GB fp32 all-reduce takes 1.31 s
    run = _run(num_gpus=4, tokens_per_sample=1024)
    step = step_time(run, slow, "ddp")
    reduce = 2 * 3 / 4 * 4 * 7e9 / 32e9
    assert step.communication_s == pytest.approx(reduce)
    backward = 2 / 3 * 1024 * 4.6e10 / (165.2e12 * 0.40)  # of one micro-batch: 0.48 s
    assert step.exposed_s == pytest.approx(reduce - backward)
    # Accumulation adds compute, not communication (no_sync on the other micro-batches).
    more = step_time(_run(num_gpus=4, tokens_per_sample=1024, accumulation=8), slow, "ddp")
    assert more.communication_s == step.communication_s and more.exposed_s == step.exposed_s
    fast = step_time(_run(num_gpus=4), gpu_spec("h100"), "ddp")  # 450 GB/s NVLink: hidden
    assert fast.exposed_s == 0 and fast.step_s == fast.compute_s


def test_sharded_strategies_move_the_zero_paper_volumes() -> None:
    h100 = gpu_spec("h100")
    run = _run(accumulation=1)
    gather = 7 / 8 * 2 * 7e9 / 450e9  # 16-bit weights
    fsdp = step_time(run, h100, "fsdp")
    # Forward and backward all-gathers, and the gradients' reduce-scatter in fp32.
    assert fsdp.communication_s == pytest.approx(2 * gather + 7 / 8 * 4 * 7e9 / 450e9)
    zero3 = step_time(run, h100, "zero3")
    assert zero3.communication_s == pytest.approx(3 * gather)  # ZeRO-3: 3 x the 16-bit model
    zero1, zero2 = step_time(run, h100, "zero1"), step_time(run, h100, "zero2")
    assert zero1.communication_s == pytest.approx(2 * gather)  # as DDP's 2 x, in 16 bits
    assert zero1.exposed_s == pytest.approx(gather)  # the weights' all-gather after the step
    accumulated = _run(accumulation=4)
    assert step_time(accumulated, h100, "zero2").communication_s == pytest.approx(5 * gather)
    assert step_time(accumulated, h100, "zero1").communication_s == pytest.approx(2 * gather)
    assert zero2.communication_s == zero1.communication_s
    offload = step_time(run, h100, "zero3_offload")
    upload = 2 * 7e9 / 8 / 64e9  # the updated 16-bit shard, over PCIe, after the CPU's step
    assert offload.communication_s == pytest.approx(zero3.communication_s + 2 * upload)
    assert offload.exposed_s == pytest.approx(zero3.exposed_s + upload)
    assert step_time(_run(num_gpus=1), h100, "none").communication_s == 0


def test_run_cost_is_steps_times_step_time() -> None:
    step = step_time(_run(), gpu_spec("h100"), "fsdp")
    total = run_cost(step, tokens=10**10, price_per_gpu_hour=2.49)
    assert total.steps == math.ceil(10**10 / (4 * 8 * 4096))
    assert total.hours == pytest.approx(total.steps * step.step_s / 3600)
    assert total.dollars == pytest.approx(total.hours * 8 * 2.49)
    assert run_cost(step, steps=10).dollars is None  # no price, no cost
    with pytest.raises(ValueError, match="exactly one"):
        run_cost(step, tokens=1, steps=1)


def test_shape_flops_count_the_given_parameters() -> None:
    shape = TransformerShape(32, 4096, 4096, vocab_size=32000, arch="llama")
    assert shape_flops_per_token(shape, 7 * 10**9) == shape.flops_per_token() + 6 * (
        7 * 10**9 - shape.num_params()
    )


# --- the GPU table and hardware files ------------------------------------------------------


def test_prices_are_the_guides_machine_prices_per_gpu() -> None:
    """The multi-GPU guide: 4x RTX 4090 at $1.60/h, 8x A100 80GB at $9.60/h, 8x H100 at
    $19.92/h; GPUs it does not price have no price."""
    assert GPU_TYPES["rtx4090"].price_per_gpu_hour == pytest.approx(1.60 / 4)
    assert GPU_TYPES["a100-80gb"].price_per_gpu_hour == pytest.approx(9.60 / 8)
    assert GPU_TYPES["h100"].price_per_gpu_hour == pytest.approx(19.92 / 8)
    assert {n for n, s in GPU_TYPES.items() if s.price_per_gpu_hour is None} == {
        "h200",
        "a100-40gb",
        "l40s",
    }
    assert all(spec.source for spec in GPU_TYPES.values())


def test_hardware_files(tmp_path: Path) -> None:
    based = tmp_path / "hw.yaml"
    based.write_text("gpu_type: a100-80gb\nprice_per_gpu_hour: 1.79\ninter_node_gbps: 12.5\n")
    spec = load_hardware(based)
    assert (spec.bf16_tflops, spec.price_per_gpu_hour, spec.inter_node_gbps) == (312, 1.79, 12.5)
    full = tmp_path / "hw.json"
    fields = {"name": "MI300X", "bf16_tflops": 1307.4, "memory_gib": 192}
    full.write_text(json.dumps({**fields, "intra_node_gbps": 64, "inter_node_gbps": 50}))
    with pytest.raises(HardwareError, match="missing pcie_gbps"):
        load_hardware(full)
    full.write_text(
        json.dumps({**fields, "intra_node_gbps": 64, "inter_node_gbps": 50, "pcie_gbps": 64})
    )
    assert load_hardware(full).price_per_gpu_hour is None
    for text, message in [
        (
            "gpu_type: h100\nbf16_tflop: 1\n",
            "unknown field 'bf16_tflop' (did you mean 'bf16_tflops'?)",
        ),
        ("gpu_type: h10\n", "did you mean 'h100'"),
        ("gpu_type: h100\nmfu: 1.5\n", "mfu: expected a finite number > 0 and <= 1"),
        ("gpu_type: h100\npcie_gbps: .nan\n", "pcie_gbps"),
        ("gpu_type: h100\nprice_per_gpu_hour: cheap\n", "price_per_gpu_hour"),
        ("- h100\n", "expected a mapping"),
        ("gpu_type: [h100\n", "not valid YAML"),
    ]:
        based.write_text(text)
        with pytest.raises(HardwareError, match=re.escape(message)):
            load_hardware(based)
    with pytest.raises(HardwareError, match="no such config file"):
        load_hardware(tmp_path / "missing.yaml")


# --- the command ---------------------------------------------------------------------------


def test_the_issue_command_prints_hours_and_dollars_per_strategy(issue_text: str) -> None:
    lines = issue_text.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("time and cost of"))
    memory = next(i for i, line in enumerate(lines) if line.startswith("memory per GPU"))
    assert (
        memory < title < next(i for i, line in enumerate(lines) if line.startswith("recommended"))
    )
    assert lines[title].startswith("time and cost of 10B tokens (")
    assert "8 x H100 SXM 80GB (1 node of 8), MFU 40%, $2.49/GPU-hour:" in lines[title]
    assert "hours" in lines[title + 1] and "cost" in lines[title + 1]
    rows = {line.split()[0]: line.split() for line in lines[title + 2 : title + 7]}
    assert set(rows) == set(STRATEGIES)
    for name, cells in rows.items():
        assert cells[-2].startswith("$") and cells[-1] in ("yes", "NO"), name
    assert rows["ddp"][-1] == "NO" and rows["fsdp"][-1] == "yes"
    assert "fastest that fits: fsdp" in issue_text
    for text in ("assumptions:", "MFU 40%", "overlap: DDP's bucketed all-reduce", "torchtitan"):
        assert text in issue_text
    assert "$19.92/h" in issue_text  # the price's source


def test_the_issue_command_in_json_adds_up(issue_json: dict[str, Any]) -> None:
    t = issue_json["time"]
    assert t["gpu_type"] == "h100" and t["hardware"]["bf16_tflops"] == 989.4
    assert t["tokens"] == 10**10 and t["steps"] is None
    assert t["tokens_per_step"] == issue_json["batch"]["global"] * 4096
    assert set(t["strategies"]) == set(issue_json["candidates"]) == set(STRATEGIES)
    for name, row in t["strategies"].items():
        assert row["fits"] == issue_json["candidates"][name]["fits"]
        assert row["steps"] == math.ceil(10**10 / t["tokens_per_step"])
        assert row["step_s"] == pytest.approx(row["compute_s"] + row["exposed_s"])
        assert 0 <= row["exposed_s"] <= row["communication_s"]
        assert row["hours"] == pytest.approx(row["steps"] * row["step_s"] / 3600)
        assert row["dollars"] == pytest.approx(row["hours"] * 8 * 2.49)
        assert row["tokens_per_s"] == pytest.approx(t["tokens_per_step"] / row["step_s"])
    assert t["assumptions"] and issue_json["plot"] is None


def test_memory_md_shows_the_issue_commands_output(issue_text: str) -> None:
    """docs/memory.md's example is this command's output, line for line."""
    doc = (REPO / "docs" / "memory.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(doc) if line.startswith("time and cost of 10B"))
    shown = doc[start : doc.index("```", start)]
    lines = issue_text.splitlines()
    first = lines.index(shown[0])
    assert lines[first : first + len(shown)] == shown


def test_flags_override_the_table_and_a_file_equals_the_flags(tmp_path: Path) -> None:
    flags = ["--mfu", "0.5", "--price-per-gpu-hour", "3", "--intra-node-gbps", "100"]
    flags += ["--inter-node-gbps", "400Gb/s", "--pcie-gbps", "16"]
    by_flags = plan_json([*GPT2_NODE, "--gpu-type", "h100", "--steps", "1000", *flags])
    hw = by_flags["time"]["hardware"]
    assert (hw["mfu"], hw["price_per_gpu_hour"], hw["intra_node_gbps"]) == (0.5, 3.0, 100.0)
    assert (hw["inter_node_gbps"], hw["pcie_gbps"]) == (50.0, 16.0)
    ddp = by_flags["time"]["strategies"]["ddp"]
    assert ddp["communication_s"] == pytest.approx(2 * 7 / 8 * 4 * 124_000_000 / 100e9)
    assert ddp["dollars"] == pytest.approx(ddp["gpu_hours"] * 3)
    file = tmp_path / "hw.yaml"
    file.write_text(
        "gpu_type: h100\nmfu: 0.5\nprice_per_gpu_hour: 3\nintra_node_gbps: 100\n"
        "inter_node_gbps: 50\npcie_gbps: 16\n"
    )
    by_file = plan_json([*GPT2_NODE, "--hardware", str(file), "--steps", "1000"])
    assert by_file["time"]["strategies"] == by_flags["time"]["strategies"]
    # Flags win over the file.
    cheaper = plan_json(
        [*GPT2_NODE, "--hardware", str(file), "--steps", "1000", "--price-per-gpu-hour", "1"]
    )
    assert cheaper["time"]["strategies"]["ddp"]["dollars"] == pytest.approx(ddp["gpu_hours"])


def test_without_an_amount_the_table_has_step_times_only() -> None:
    code, out, err = plan([*GPT2_NODE, "--gpu-type", "l40s"])
    assert code == 0, err
    assert "time per step of 524,288 tokens, on 8 x L40S 48GB" in out
    assert "(--tokens or --steps for hours and cost)" in out
    assert "no price for L40S 48GB: give --price-per-gpu-hour" in out
    code, out, _ = plan(GPT2_NODE)  # no hardware: no time table, the plan as before
    assert code == 0 and "time per step" not in out and "time and cost" not in out


def test_plot_draws_memory_and_time(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    code, out, err = plan(
        [*GPT2_NODE, "--gpu-type", "a100-80gb", "--tokens", "10B", "--plot", str(png)]
    )
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot: {png}" in out
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]  # no temporary left


def test_plot_without_matplotlib_is_one_line_and_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    png = tmp_path / "plan.png"
    code, out, err = plan([*GPT2_NODE, "--plot", str(png), "--json"])
    assert code == 0
    assert json.loads(out)["plot"] is None
    assert err.count("\n") == 1 and "matplotlib is not installed" in err
    assert not png.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tokens", "1e10"], "plan: --tokens needs the hardware: --gpu-type (h100, "),
        (["--mfu", "0.5"], "plan: --mfu needs the hardware"),
        (["--gpu-type", "h100", "--tokens", "1e10", "--steps", "5"], "not allowed with"),
        (["--gpu-type", "h10"], "argument --gpu-type: invalid choice: 'h10'"),
        (["--hardware", "missing.yaml"], "plan: --hardware: missing.yaml: no such config file"),
        (["--hardware", "hw.yaml"], "plan: --hardware: hw.yaml: unknown field 'bf16'"),
        (["--plot", "plan.txt"], "plan: --plot: expected a .png, .svg or .pdf file"),
        (["--plot", "nowhere/plan.png"], "plan: --plot: no such directory 'nowhere'"),
    ],
)
def test_bad_cost_input_is_one_line_exit_2_and_writes_nothing(
    extra: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hw.yaml").write_text("gpu_type: h100\nbf16: 1\n")
    code, out, err = plan([*GPT2_NODE, *extra])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("gpu-training: error:") and message in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hw.yaml"]
