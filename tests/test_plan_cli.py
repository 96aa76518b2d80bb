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
import shlex
from pathlib import Path
from typing import Any

import pytest

from gpu_training.cli import build_parser, main
from gpu_training.commands.plan import parse_count, parse_size
from gpu_training.profiling import margin_ceiling, per_device_batch_for_share

GIB = 2**30
REPO = Path(__file__).resolve().parents[1]
DDP_CONFIG = REPO / "configs" / "ddp_config.yaml"
TINY_TASK = [  # the built-in task, small enough for a real training step in a test
    "charlm",
    *("--task-option", "n_layer=1"),
    *("--task-option", "n_head=2"),
    *("--task-option", "n_embd=16"),
    *("--task-option", "block_size=16"),
]
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


# --- the batch for a global batch ------------------------------------------------------------


@pytest.mark.parametrize(
    "subject",
    [[str(DDP_CONFIG)], ["charlm", "--global-batch", "32"]],
    ids=["job-file", "built-in-task"],
)
def test_a_share_that_fits_is_not_split_by_the_margin(
    subject: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # charlm's share of 16 per GPU takes a few MiB of 80 GiB: 16 x 1, not 0.85 x 16 -> 8 x 2.
    b = plan_json([*subject, "--gpu-memory", "80", "--gpus", "2"], capsys)["batch"]
    assert (b["per_device"], b["gradient_accumulation_steps"], b["global"]) == (16, 1, 32)
    assert b["note"] == "the whole per-GPU share of 16 fits with the 0.85 margin"
    assert b["largest_fitting"] >= margin_ceiling(16, 0.85) == 19  # searched that far, no more


def test_a_share_that_does_not_fit_takes_the_margin_and_a_divisor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 30 MiB for the step, 64 MiB for the two cuBLAS workspaces of a Hopper GPU
    argv = [str(DDP_CONFIG), "--gpu-memory", "94MiB", "--overhead", "1MiB", "--gpus", "1"]
    b = plan_json(argv, capsys)["batch"]
    largest = b["largest_fitting"]
    assert 1 < largest < 32  # the share of 32 does not fit: the margin decides
    kept = math.floor(0.85 * largest)
    assert b["per_device"] == max(d for d in range(1, kept + 1) if 32 % d == 0)
    assert b["per_device"] * b["gradient_accumulation_steps"] * 1 == b["global"] == 32
    assert "does not fit with the 0.85 margin" in b["note"]


def test_per_device_batch_for_share() -> None:
    assert per_device_batch_for_share(16, recommended=16) == 16
    assert per_device_batch_for_share(16, recommended=870) == 16  # more is of no use
    assert per_device_batch_for_share(16, recommended=13) == 8
    assert per_device_batch_for_share(97, recommended=96) == 1  # a prime share
    assert per_device_batch_for_share(2**24, recommended=2**24 - 1) == 2**23
    for share in range(1, 61):
        for rec in range(1, 65):
            got = per_device_batch_for_share(share, rec)
            assert share % got == 0 and (got == share or got <= rec)
            assert got == max(d for d in range(1, share + 1) if share % d == 0 and d <= rec)
    for margin in (0.5, 0.85, 0.9, 0.29, 1.0):
        for batch in (1, 7, 16, 100, 1000):
            c = margin_ceiling(batch, margin)
            percent = round(margin * 100)  # the margin as an exact decimal
            assert percent * c // 100 >= batch > percent * (c - 1) // 100
    with pytest.raises(ValueError, match="share"):
        per_device_batch_for_share(0, 4)
    with pytest.raises(ValueError, match="safety_margin"):
        margin_ceiling(4, 0.0)


# --- the printed launch command runs -----------------------------------------------------------


def _launch_block(out: str) -> tuple[list[str], str | None]:
    """The commands under ``launch`` and the ``job.yaml:`` line's YAML, as a user copies them."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("launch"))
    block = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line.strip())
    job = next((b.removeprefix("job.yaml: ") for b in block if b.startswith("job.yaml: ")), None)
    return [b for b in block if b.startswith(("gpu-training ", "torchrun "))], job


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")
def test_the_launch_printed_for_a_task_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert (
        main(["plan", *TINY_TASK, "--gpu-memory", "16", "--gpus", "1", "--global-batch", "8"]) == 0
    )
    commands, job = _launch_block(capsys.readouterr().out)
    assert commands == ["gpu-training train job.yaml --nproc 1"] and job is not None
    (tmp_path / "job.yaml").write_text(job + "\n")  # the line, as printed
    argv = shlex.split(commands[0])
    assert main([*argv[1:], "--set", "training.max_steps=1"]) == 0  # a real step
    capsys.readouterr()
    manifests = list(tmp_path.glob("runs/*/checkpoints/step-*/manifest.json"))
    assert len(manifests) == 1


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")
def test_the_launch_printed_for_a_job_file_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = [str(DDP_CONFIG), "--gpu-memory", "16", "--gpus", "1", "--lr", "1e-3"]
    assert main(["plan", *argv]) == 0
    commands, job = _launch_block(capsys.readouterr().out)
    assert job is None and len(commands) == 1
    command = shlex.split(commands[0])
    assert command[:5] == ["gpu-training", "train", str(DDP_CONFIG), "--nproc", "1"]
    assert "training.learning_rate=0.001" in command  # --lr reaches the job
    steps = ["--set", "training.max_steps=1", "--set", "training.warmup_steps=0"]
    assert main([*command[1:], *steps]) == 0
    capsys.readouterr()
    assert len(list(tmp_path.glob("runs/*/checkpoints/step-*/manifest.json"))) == 1


def test_the_launch_printed_for_several_gpus_validates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpu_training.job import load_job
    from gpu_training.trainer import check_job

    monkeypatch.chdir(tmp_path)
    task = [*TINY_TASK, "--gpu-memory", "16", "--global-batch", "32"]
    assert main(["plan", *task, "--gpus", "2", "--precision", "fp32"]) == 0
    commands, job = _launch_block(capsys.readouterr().out)
    assert commands == ["gpu-training train job.yaml --nproc 2"] and job is not None
    (tmp_path / "job.yaml").write_text(job + "\n")
    # What `train --nproc 2` checks before it starts torchrun: the job, and its split.
    args = build_parser().parse_args(shlex.split(commands[0])[1:])
    loaded = load_job(args.config, args.overrides)
    check_job(loaded)
    training = loaded.training.for_world_size(args.nproc)
    assert (training.effective_batch_size, training.precision) == (32, "fp32")
    # Two nodes: one `gpu-training launch` line, the same on each; --print checks and shows it.
    assert main(["plan", *task, "--gpus", "16", "--gpus-per-node", "8"]) == 0
    out = capsys.readouterr().out
    commands, job = _launch_block(out)
    assert "the same line on each of the 2 nodes" in out
    assert commands == [
        "gpu-training launch --nproc 8 --nnodes 2 --rdzv-endpoint HEAD_NODE:29500 job.yaml"
    ]
    assert job is not None
    (tmp_path / "job.yaml").write_text(job + "\n")
    argv = shlex.split(commands[0])
    assert main([argv[1], "--print", *argv[2:]]) == 0
    assert "--module gpu_training train job.yaml" in capsys.readouterr().out


def test_plan_json_carries_the_job_file(capsys: pytest.CaptureFixture[str]) -> None:
    r = plan_json([*TINY_TASK, "--gpu-memory", "16", "--gpus", "2", "--global-batch", "8"], capsys)
    assert r["launch"] == ["gpu-training train job.yaml --nproc 2"]
    assert r["job_file"] == {
        "task": "charlm",
        "task_options": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
        "training": {"per_device_batch_size": 4, "global_batch_size": 8},
        "strategy": {"name": "ddp"},
    }
    shape = plan_json([*GPT2, *NODE, "--global-batch", "512"], capsys)
    assert shape["job_file"] is None  # a shape has no task: the user's script runs


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
        (
            ["find-batch", "configs/ddp_config.yaml", "--gpu-memory", "1GiB", "--gpus", "3"],
            "training.global_batch_size 32 does not split over 3 ranks",
        ),
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
    # The job's global batch is 8: 6 does not divide it, 4 does (x 2 accumulation).
    assert r["job"] == {
        "global_batch": 8,
        "world_size": 1,
        "per_rank": 8,
        "per_device": 4,
        "gradient_accumulation_steps": 2,
        "whole_share_fits": False,
        "set": ["training.per_device_batch_size=4"],
        "command": f"gpu-training train {job} --set training.per_device_batch_size=4",
    }
    t = r["throughput"]  # timed at the job's per-device batch, not at 6
    assert t["samples_per_s"] > 0 and t["tokens_per_s"] == pytest.approx(16 * t["samples_per_s"])
    assert 0 < t["mfu"] < 1 and t["peak_tflops"] == 1.0
    assert main([*argv, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "with the 0.85 safety margin: 6 per device, below this job's 8 per rank" in out
    assert "recommended for this job: per-device 4 x accumulation 2 x 1 rank = global 8" in out
    assert "  --set training.per_device_batch_size=4\n" in out
    assert "raise --max-batch" in out and "throughput at 4:" in out
    # By the estimate: a 1 GiB "GPU" (500 MiB of it overhead) holds a bounded batch.
    assert (
        main(["find-batch", str(job), "--gpu-memory", "1GiB", "--max-batch", "100000", "--json"])
        == 0
    )
    e = json.loads(capsys.readouterr().out)
    assert e["mode"] == "estimated" and 1 < e["best_fitting"] < 100000
    assert e["recommended"] == math.floor(0.85 * e["best_fitting"])
    assert os.listdir(tmp_path) == ["job.yaml"]


def test_find_batch_answers_for_the_jobs_global_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpu_training.job import load_job

    job = tmp_path / "job.yaml"
    job.write_text(TINY_JOB)  # global batch 8
    argv = ["find-batch", str(job), "--gpu-memory", "1GiB", "--gpus", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    recommended = int(out.split("with the 0.85 safety margin: ")[1].split()[0])
    assert recommended > 4  # hundreds fit: a per-device batch above the share is of no use
    assert (
        f"{recommended} per device; this job needs 4 per rank (global batch 8 over 2 ranks), "
        "so a per-device batch above 4 is of no use to it"
    ) in out
    assert "recommended for this job: per-device 4 x accumulation 1 x 2 ranks = global 8" in out
    assert "raise --max-batch" not in out
    command = out.splitlines()[-1].strip()
    assert command == f"gpu-training train {job} --nproc 2 --set training.per_device_batch_size=4"
    # The command is the job it describes: 4 per device x 2 ranks = 8, no accumulation.
    args = build_parser().parse_args(shlex.split(command)[1:])
    training = load_job(args.config, args.overrides).training.for_world_size(args.nproc)
    assert (training.per_device_batch_size, training.gradient_accumulation_steps) == (4, 1)
    # A share larger than fits: the largest divisor of it within the margin, with accumulation.
    big = [*argv, "--set", "training.global_batch_size=8192", "--json"]
    assert main(big) == 0
    r = json.loads(capsys.readouterr().out)
    j = r["job"]
    assert j["per_rank"] == 4096 > r["recommended"] and not j["whole_share_fits"]
    assert j["per_device"] == max(d for d in range(1, r["recommended"] + 1) if 4096 % d == 0)
    assert j["per_device"] * j["gradient_accumulation_steps"] * 2 == 8192
    assert j["command"].endswith(
        f"--set training.global_batch_size=8192 --set training.per_device_batch_size="
        f"{j['per_device']}"
    )
    assert os.listdir(tmp_path) == ["job.yaml"]
