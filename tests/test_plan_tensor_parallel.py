"""``gpu-training plan`` and the 2-D layout: FSDP across nodes, tensor parallel inside a node.

The arithmetic is pinned against hand calculations written out here (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198: with tensor
and sequence parallel over t GPUs, activations are divided by t, and each block's attention and
MLP move one all-reduce's worth of b·s·h activations in forward). The CLI cases are the issue's
70B shape on 16 x 80 GB.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_training.cli import main
from gpu_training.cost import TrainingRun, step_time
from gpu_training.hardware import gpu_spec
from gpu_training.memory import TransformerShape, profile_memory

SHAPE_70B = ["--params", "70e9", "--layers", "80", "--hidden", "8192", "--seq", "4096"]
ISSUE = [*SHAPE_70B, "--gpus", "16", "--gpu-memory", "80GB"]
TIMED = [*ISSUE, "--gpu-type", "h100", "--tokens", "1e10", "--global-batch", "256"]
STRATEGIES_MD = Path(__file__).resolve().parents[1] / "docs" / "strategies.md"


def plan(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", *argv])
    return code, out.getvalue(), err.getvalue()


def plan_json(argv: list[str]) -> dict[str, Any]:
    code, out, err = plan([*argv, "--json"])
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def test_2d_step_time_by_hand() -> None:
    """70B, 16 H100 in 2 nodes of 8, TP 8 x FSDP 2, one sample of 4096 tokens per group."""
    run = TrainingRun(
        num_params=70 * 10**9,
        flops_per_token=4.2e11,  # 6N
        tokens_per_sample=4096,
        micro_batch=1,
        num_gpus=16,
        gpus_per_node=8,
        precision="bf16",
        tensor_parallel=8,
        num_layers=80,
        hidden_size=8192,
    )
    step = step_time(run, gpu_spec("h100"), "fsdp")  # 989.4 TFLOP/s, 450 / 50 GB/s, MFU 0.4
    # Compute: each of the 8 GPUs of a group does 1/8 of 4096 tokens x 4.2e11 FLOPs.
    compute = 4096 * 4.2e11 / (989.4e12 * 0.4 * 8)  # 0.5434 s
    forward, backward = compute / 3, 2 * compute / 3  # 0.1811 s, 0.3622 s
    # Tensor parallel: b·s·h in bf16 = 1 x 4096 x 8192 x 2 B = 67,108,864 B; one ring
    # all-reduce over the 8 GPUs of a node on NVLink: 2 x 7/8 x 67,108,864 / 450e9.
    all_reduce = 2 * 7 / 8 * 67_108_864 / 450e9  # 2.610e-4 s
    # Per block: attention + MLP = 2 in forward, 4 in backward; 80 blocks.
    tp = 80 * (2 + 4) * all_reduce  # 0.1253 s, on the critical path
    # FSDP over the 2 data-parallel groups: a 2-GPU ring with one GPU in each node, so all of
    # it crosses the network: (2-1)/2 of the group's 1/8 of the parameters, at 50 GB/s.
    gather = 1 / 2 * (2 * 70e9 / 8) / 50e9  # bf16 weights: 0.175 s
    scatter = 1 / 2 * (4 * 70e9 / 8) / 50e9  # fp32 gradients: 0.35 s
    # Overlap as FSDP's: the forward gather under forward, gather + scatter under backward.
    exposed = max(0.0, gather - forward) + max(0.0, gather + scatter - backward) + tp
    assert step.strategy == "fsdp+tp8"
    assert step.compute_s == pytest.approx(compute, rel=1e-12)
    assert step.communication_s == pytest.approx(2 * gather + scatter + tp, rel=1e-12)
    assert step.exposed_s == pytest.approx(exposed, rel=1e-12)
    assert exposed == pytest.approx(0.2880, abs=1e-4)
    # A step trains one sample per data-parallel group: 2 x 4096 tokens.
    assert step.tokens_per_step == 8192
    assert step.tokens_per_s == pytest.approx(8192 / (compute + exposed))
    # The same run without tensor parallel is not what was priced (the control).
    flat = step_time(
        TrainingRun(70 * 10**9, 4.2e11, 4096, 1, num_gpus=16), gpu_spec("h100"), "fsdp"
    )
    assert flat.compute_s == pytest.approx(8 * compute) and flat.tokens_per_step == 16 * 4096


def test_tensor_parallel_needs_a_node() -> None:
    with pytest.raises(ValueError, match="stays inside a node"):
        TrainingRun(
            70 * 10**9,
            4.2e11,
            4096,
            1,
            num_gpus=16,
            tensor_parallel=16,
            num_layers=80,
            hidden_size=8192,
        )
    with pytest.raises(ValueError, match="fsdp only"):
        step_time(
            TrainingRun(
                70 * 10**9,
                4.2e11,
                4096,
                1,
                num_gpus=16,
                tensor_parallel=8,
                num_layers=80,
                hidden_size=8192,
            ),
            gpu_spec("h100"),
            "ddp",
        )


def test_2d_memory_by_hand() -> None:
    shape = TransformerShape(num_layers=80, hidden_size=8192, seq_len=4096)
    profile = profile_memory(
        shape=shape, num_params=70 * 10**9, precision="bf16", device="cuda", fused=True
    )
    flat = profile.estimate(1, strategy="fsdp", world_size=16, activation_checkpointing=True)
    two_d = profile.estimate(
        1, strategy="fsdp", world_size=16, activation_checkpointing=True, tensor_parallel=8
    )
    # Model state: TP 8 x FSDP 2 shards 16 ways, as FSDP over 16 does: 70e9 x (4 B fp32
    # weights + 4 B gradients + 8 B AdamW moments) / 16 = 7.0e10 B = 65.2 GiB.
    state = 70e9 * (4 + 4 + 8) / 16
    assert two_d.model_state == flat.model_state
    assert two_d.model_state == pytest.approx(state, rel=1e-3)  # the reference's buffers
    assert (two_d.tensor_parallel, flat.tensor_parallel) == (8, 1)
    # Activations with checkpointing: each block keeps its input, b·s·h in bf16, sequence-
    # sharded 8 ways: 80 x 1 x 4096 x 8192 x 2 B / 8 = 640 MiB, plus the outside of the blocks
    # (embedding, logits, loss; loss-parallel, so also / 8).
    block_inputs = 80 * 4096 * 8192 * 2 / 8
    assert block_inputs <= two_d.activations <= 1.15 * block_inputs
    assert two_d.activations == math.ceil(flat.activations / 8)
    assert two_d.total < flat.total
    with pytest.raises(ValueError, match="needs the fsdp layout"):
        profile.estimate(1, strategy="ddp", world_size=16, tensor_parallel=8)


@pytest.fixture(scope="module")
def worked_text() -> str:
    code, out, err = plan(TIMED)
    assert code == 0, err
    return out


def test_the_issue_shape_recommends_2d_without_offload(worked_text: str) -> None:
    """With the hardware (and the Trainer's fused AdamW): a 2-D layout, its memory and time."""
    r = plan_json(TIMED)
    rec = r["recommended"]
    t = rec["tensor_parallel"]
    assert t in (2, 4, 8) and rec["strategy"] == "fsdp" and rec["offload"] == "none"
    assert rec["fits"] and "steps faster than fsdp alone" in rec["reason"]
    row = r["candidates"][f"fsdp+tp{t}"]
    assert row["fits"] and row["total"] <= 80 * 2**30
    timed = r["time"]["strategies"]
    assert timed[f"fsdp+tp{t}"]["tokens_per_s"] > timed["fsdp"]["tokens_per_s"]
    assert rec["strategy_config"] == {"name": "fsdp", "tensor_parallel": t}
    b = r["batch"]
    assert b["per_device"] * b["gradient_accumulation_steps"] * b["data_parallel"] == 256
    assert b["data_parallel"] == 16 // t
    # The printed job file: its strategy section as YAML.
    out = worked_text
    line = next(x for x in out.splitlines() if x.strip().startswith("job file: strategy:"))
    printed = yaml.safe_load(line.split("strategy:", 1)[1])
    assert printed == {"name": "fsdp", "tensor_parallel": t}
    # ... and it is a job file's strategy the Trainer takes (checked as train checks it)
    from gpu_training.job import JobConfig

    assert JobConfig.from_dict({"strategy": printed}).strategy.tensor_parallel == t
    assert f"recommended: FSDP + tensor parallel {t} (2-D)" in out
    assert out.count("torchrun --nnodes=2 --nproc_per_node=8") == 2
    forced = plan_json([*TIMED, "--tensor-parallel", "8"])
    assert forced["recommended"]["strategy_config"] == {"name": "fsdp", "tensor_parallel": 8}
    assert forced["candidates"]["fsdp+tp8"]["fits"]


def test_the_issue_command_alone_no_longer_needs_offload() -> None:
    """The issue's command as written (no GPU type, so no time to compare): with the
    Trainer's fused AdamW (no scratch the size of the shard), FSDP with activation
    checkpointing fits on the GPUs alone: no offload. Which of FSDP and 2-D is faster needs
    the hardware (the test above)."""
    r = plan_json(ISSUE)
    rec = r["recommended"]
    assert (rec["strategy"], rec["offload"], rec["tensor_parallel"]) == ("fsdp", "none", 1)
    assert rec["activation_checkpointing"] and r["candidates"]["fsdp"]["fits"]


def test_foreach_scratch_leaves_no_room_and_offload_stays() -> None:
    """torch's default foreach AdamW keeps a scratch the size of the shard: 65.2 + 16.3 GiB."""
    r = plan_json([*ISSUE, "--foreach-optimizer"])
    rec = r["recommended"]
    assert (rec["strategy"], rec["offload"], rec["tensor_parallel"]) == (
        "deepspeed",
        "optimizer",
        1,
    )
    row = r["candidates"]["fsdp+tp8"]
    assert not row["fits"] and "does not fit" in r["tensor_parallel"]["reason"]
    # Without TP's reason to appear (FSDP fits), the table keeps its five rows.
    small = plan_json(
        [
            "--params",
            "6.74e9",
            "--layers",
            "32",
            "--hidden",
            "4096",
            "--gpus",
            "8",
            "--gpu-memory",
            "80",
        ]
    )
    assert r["tensor_parallel"] is not None and small["tensor_parallel"] is None
    assert list(small["candidates"]) == ["ddp", "zero1", "zero2", "fsdp", "zero3_offload"]


@pytest.mark.parametrize(
    "argv, message",
    [
        ([*ISSUE, "--tensor-parallel", "16"], "never spans nodes"),
        ([*ISSUE, "--tensor-parallel", "3"], "must divide the GPUs per node (8)"),
        (
            [*ISSUE, "--gpus-per-node", "6", "--gpus", "12", "--tensor-parallel", "6"],
            "must divide the attention heads (128)",
        ),
    ],
    ids=["spans-nodes", "not-a-divisor", "heads"],  # a model: tests/test_plan_tp_trains.py
)
def test_a_degree_that_cannot_be_is_one_line_exit_2(argv: list[str], message: str) -> None:
    code, out, err = plan(argv)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "--tensor-parallel" in lines[0], err


def test_strategies_md_shows_the_worked_examples_output(worked_text: str) -> None:
    """docs/strategies.md's 70B example is this command's output, part by part."""
    doc = STRATEGIES_MD.read_text(encoding="utf-8").splitlines()
    start = doc.index("memory per GPU at per-device batch 2 (activation checkpointing on):")
    shown = doc[start : doc.index("```", start)]
    lines = worked_text.splitlines()
    parts: list[list[str]] = [[]]
    for line in shown:
        if line == "...":
            parts.append([])
        else:
            parts[-1].append(line)
    assert len(parts) == 4
    for part in parts:
        first = lines.index(part[0])
        assert lines[first : first + len(part)] == part
    forced = plan_json([*TIMED, "--tensor-parallel", "8"])
    rate = forced["time"]["strategies"]["fsdp+tp8"]["tokens_per_s"]
    assert f"{rate:,.0f} tokens/s here, slower" in "\n".join(doc)
