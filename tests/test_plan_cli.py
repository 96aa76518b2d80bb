"""``gpu-training plan`` and ``gpu-training find-batch``, run in-process through ``cli.main``.

The plan cases are the issue's: on 8 x 80 GB, GPT-2 124M and 1.5B shapes train with DDP, a
Llama-7B shape needs FSDP, and a 70B shape does not fit even fully sharded, so the plan says
so and recommends CPU offload, with the GPU count at which sharding alone would fit.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from gpu_training.cli import main
from gpu_training.commands.plan import parse_count, parse_size

GIB = 2**30
NODE = ["--gpu-memory", "80", "--gpus", "8"]
GPT2 = ["--params", "124M", "--layers", "12", "--hidden", "768", "--seq", "1024"]
GPT2_XL = [
    "--params",
    "1.5B",
    "--layers",
    "48",
    "--hidden",
    "1600",
    "--heads",
    "25",
    "--seq",
    "1024",
]
LLAMA_7B = [
    "--params",
    "6.74e9",
    "--layers",
    "32",
    "--hidden",
    "4096",
    "--seq",
    "4096",
    "--vocab",
    "32000",
    "--arch",
    "llama",
]
LLAMA_70B = [
    "--params",
    "70e9",
    "--layers",
    "80",
    "--hidden",
    "8192",
    "--heads",
    "64",
    "--kv-heads",
    "8",
    "--ffn",
    "28672",
    "--seq",
    "4096",
    "--vocab",
    "32000",
    "--arch",
    "llama",
]


def plan_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["plan", *argv, "--json"]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


@pytest.mark.parametrize("shape", [GPT2, GPT2_XL], ids=["gpt2-124M", "gpt2-1.5B"])
def test_gpt2_shapes_use_ddp(shape: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    r = plan_json([*shape, *NODE, "--global-batch", "512"], capsys)
    rec = r["recommended"]
    assert (rec["strategy"], rec["fits"], r["activation_checkpointing"]) == ("ddp", True, False)
    assert "Replicated state fits one GPU" in rec["reason"] and "<= 79.5 GiB" in rec["reason"]
    ddp = r["candidates"]["ddp"]
    assert ddp["fits"] and ddp["total"] <= 80 * GIB
    assert ddp["parameters"] == 4 * r["num_params"]  # fp32 master weights under autocast
    assert ddp["optimizer_state"] == 2 * ddp["parameters"]
    b = r["batch"]
    assert b["per_device"] * b["gradient_accumulation_steps"] * 8 == b["global"] == 512
    assert b["largest_fitting"] >= b["per_device"]
    assert r["launch"] == ["torchrun --standalone --nproc_per_node=8 train.py"]


def test_llama_7b_uses_fsdp_with_the_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    r = plan_json([*LLAMA_7B, *NODE, "--global-batch", "256"], capsys)
    rec, c = r["recommended"], r["candidates"]
    assert (rec["strategy"], rec["fits"]) == ("fsdp", True)
    assert not c["ddp"]["fits"] and c["fsdp"]["fits"]
    assert "100.4 GiB" in rec["reason"]  # 16 bytes per parameter of replicated state
    assert "Replicated state does not fit one GPU" in rec["reason"]
    assert "under 10B params: FSDP" in rec["reason"]
    assert c["fsdp"]["parameters"] == math.ceil(4 * r["num_params"] / 8)
    assert r["batch"]["global"] == 256


def test_70b_needs_offload_or_more_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*LLAMA_70B, *NODE, "--global-batch", "1024"]
    r = plan_json(argv, capsys)
    rec, c = r["recommended"], r["candidates"]
    assert (rec["strategy"], rec["zero_stage"], rec["offload"]) == ("deepspeed", 3, "optimizer")
    assert rec["fits"] and r["activation_checkpointing"]  # 137 GiB of activations per sample
    assert not c["fsdp"]["fits"] and c["zero3_offload"]["fits"]
    assert "full sharding alone does not fit" in rec["reason"]
    gpus = rec["min_gpus_full_sharding"]
    assert isinstance(gpus, int) and gpus > 8 and f">= {gpus} GPUs" in rec["reason"]
    # The GPU count it names really fits, one fewer does not (same estimate, sharded wider).
    wider = plan_json(
        [
            *LLAMA_70B,
            "--gpu-memory",
            "80",
            "--gpus",
            str(gpus),
            "--activation-checkpointing",
            "on",
            "--micro-batch",
            "1",
        ],
        capsys,
    )
    assert wider["candidates"]["fsdp"]["fits"]
    assert main(["plan", *argv]) == 0
    text = capsys.readouterr().out
    assert "recommended: DeepSpeed ZeRO-3 + CPU offload of the optimizer" in text
    assert "full sharding alone does not fit" in text
    assert "zero_stage: 3, offload: optimizer, activation_checkpointing: true" in text


def test_text_plan_has_table_batch_lr_and_multi_node_launch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        *GPT2,
        "--gpu-memory",
        "40GB",
        "--gpus",
        "16",
        "--gpus-per-node",
        "8",
        "--global-batch",
        "512",
        "--lr",
        "6e-4",
        "--base-batch",
        "256",
    ]
    assert main(["plan", *argv]) == 0
    out = capsys.readouterr().out
    for row in ("ddp", "zero1", "zero2", "fsdp", "zero3_offload"):
        assert any(line.startswith(row) for line in out.splitlines()), row
    assert "recommended: DDP" in out
    assert "learning rate: 0.0012 (linear scaling of 0.0006 from batch 256 to 512)" in out
    assert out.count("torchrun --nnodes=2 --nproc_per_node=8") == 2  # one command per node


def test_plan_a_job_file_and_a_builtin_task(capsys: pytest.CaptureFixture[str]) -> None:
    config = Path(__file__).resolve().parents[1] / "configs" / "ddp_config.yaml"
    r = plan_json([str(config), "--gpu-memory", "24", "--gpus", "2"], capsys)
    assert r["recommended"]["strategy"] == "ddp" and r["batch"]["global"] == 32
    command = r["launch"][0]
    assert command.startswith(f"gpu-training train {config} --nproc 2 --set strategy.name=ddp")
    assert f"--set training.per_device_batch_size={r['batch']['per_device']}" in command
    assert r["learning_rate"]["lr"] == pytest.approx(3e-3)
    t = plan_json(
        [
            "charlm",
            "--task-option",
            "n_layer=1",
            "--task-option",
            "block_size=32",
            "--gpu-memory",
            "16",
            "--gpus",
            "1",
        ],
        capsys,
    )
    assert t["recommended"]["strategy"] == "none"
    assert t["candidates"]["ddp"]["activations"] > 0


def test_parse_sizes_and_counts() -> None:
    assert parse_size("80") == parse_size("80GB") == parse_size("80 GiB") == 80 * GIB
    assert parse_size("40960MiB") == 40 * GIB and parse_size("1.5T") == int(1.5 * 2**40)
    assert parse_count("7e9") == parse_count("7B") == 7 * 10**9 and parse_count("124M") == 124e6
    for bad in ("-4", "0", "eighty", "80XB"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_count("lots")


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["plan", "no_such_pkg.models:build", "--gpu-memory", "80"],
            "no module named 'no_such_pkg'",
        ),
        (["plan", *GPT2, "--gpu-memory", "-80"], "--gpu-memory: expected a positive size"),
        (["plan", "--gpu-memory", "80"], "give MODEL"),
        (
            ["plan", *GPT2, "--gpu-memory", "80", "--gpus", "3", "--global-batch", "8"],
            "not a multiple of --gpus 3",
        ),
        (["plan", "charlm", *GPT2, "--gpu-memory", "80"], "not both"),
        (
            ["find-batch", "configs/ddp_config.yaml", "--min-batch", "64", "--max-batch", "32"],
            "--min-batch (64) must be <= --max-batch (32)",
        ),
        (["find-batch", "missing.yaml"], "missing.yaml"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    argv = [str(repo / a) if a.startswith("configs/") else a for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("gpu-training: error:")
    assert message in captured.err
    assert os.listdir(tmp_path) == []


# --- find-batch -----------------------------------------------------------------------------

TINY_JOB = """\
task: charlm
task_options: {block_size: 16, n_layer: 1, n_head: 2, n_embd: 16}
training: {global_batch_size: 8, per_device_batch_size: 4, precision: fp32}
strategy: {name: ddp}
"""


def test_find_batch_on_cpu_and_by_estimate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(TINY_JOB)
    argv = [
        "find-batch",
        str(job),
        "--max-batch",
        "8",
        "--throughput-steps",
        "1",
        "--peak-tflops",
        "1",
    ]
    assert main([*argv, "--json", "--device", "cpu"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["mode"], r["best_fitting"], r["recommended"]) == ("measured", 8, 6)
    assert [b for b, _ in r["probes"]] == [1, 2, 4, 8] and r["hit_max_batch"]
    t = r["throughput"]
    assert t["samples_per_s"] > 0 and t["tokens_per_s"] == pytest.approx(16 * t["samples_per_s"])
    assert 0 < t["mfu"] < 1 and t["peak_tflops"] == 1.0
    assert main([*argv, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "recommended per-device batch: 6" in out and "raise --max-batch" in out
    # By the estimate: a 1 GiB "GPU" (500 MiB of it overhead) holds a bounded batch.
    assert (
        main(["find-batch", str(job), "--gpu-memory", "1GiB", "--max-batch", "100000", "--json"])
        == 0
    )
    e = json.loads(capsys.readouterr().out)
    assert e["mode"] == "estimated" and 1 < e["best_fitting"] < 100000
    assert e["recommended"] == math.floor(0.85 * e["best_fitting"])
    assert os.listdir(tmp_path) == ["job.yaml"]
