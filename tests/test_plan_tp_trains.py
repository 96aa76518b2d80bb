"""``plan --tensor-parallel`` for a model (not a shape): its printed job file trains.

A tiny Hugging Face Llama from a local ``config.json`` (2 layers, width 32, 2 heads and 2 KV
heads, so TP 2 keeps whole heads): ``plan --hf-config DIR --tensor-parallel 2 --gpus 4``
sizes the 2-D layout by the model's own ``base_model_tp_plan`` and prints a job file. That
file, written as printed, trains 4 steps on 4 gloo ranks (FSDP 2 x TP 2) through
``gpu-training train``; its weights equal a one-process run of the same file (the strategy set
to ``none`` on the command line) within 1e-5. A model without a plan is refused in one line.
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from gpu_training.cli import main
from train_jobs import train

STEPS = 4
TOL = 1e-5


def _plan(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", *argv])
    return code, out.getvalue(), err.getvalue()


def _launch(out: str) -> tuple[list[str], str]:
    """The commands under ``launch`` and the ``job.yaml:`` line, as a user copies them."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("launch"))
    block = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line.strip())
    job = next(b.removeprefix("job.yaml: ") for b in block if b.startswith("job.yaml: "))
    return [b for b in block if b.startswith("gpu-training ")], job


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from gpu_training.checkpoint import consolidate

    step = out / "checkpoints" / f"step-{STEPS:08d}"
    if (step / "state.pt").exists():
        state: dict[str, torch.Tensor] = torch.load(step / "state.pt", weights_only=True)
        return state["model_state"]
    consolidate(step, out / "weights.pt", overwrite=True)
    return torch.load(out / "weights.pt", weights_only=True)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import hf_runs as H
    from gpu_training.tasks.hf import HFTaskOptions, hf_task

    root = tmp_path_factory.mktemp("plan_tp")
    corpus = root / "corpus.txt"
    corpus.write_text(H.CORPUS.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    config = root / "llama"
    config.mkdir()
    shape = {**H.LLAMA, "num_key_value_heads": 2}  # TP 2 keeps whole heads on each rank
    (config / "config.json").write_text(json.dumps(shape))
    assets = {"corpus": str(corpus), "cache": str(root / "cache")}
    # Tokenized here, once: the ranks find the cache (as after `train`'s preflight).
    hf_task(HFTaskOptions(**H.task_options(assets, shape))).build_data()
    options = [f"tokenizer={H.TOKENIZER}", f"train_files=[{corpus}]", f"cache_dir={root / 'cache'}"]
    argv = ["--hf-config", str(config), "--seq", "32", "--gpu-memory", "16", "--gpus", "4"]
    argv += ["--global-batch", "8", "--precision", "fp32", "--lr", "3e-3"]
    argv += [part for option in options for part in ("--task-option", option)]
    return {"root": root, "argv": argv}


@pytest.mark.multirank
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_job_file_plan_prints_for_an_hf_llama_trains_in_2d(llama: dict[str, Any]) -> None:
    root: Path = llama["root"]
    code, out, err = _plan([*llama["argv"], "--tensor-parallel", "2"])
    assert code == 0, err
    commands, printed = _launch(out)
    assert commands == ["gpu-training train job.yaml --nproc 4"]
    job = yaml.safe_load(printed)
    assert job["strategy"] == {"name": "fsdp", "tensor_parallel": 2}
    assert "recommended: FSDP + tensor parallel 2 (2-D)" in out
    # The plan leaves the embeddings, norms and head whole on both GPUs of a group.
    assert "fsdp+tp2" in out
    job_file = root / "job.yaml"
    job_file.write_text(printed + "\n")  # as printed: no edit
    steps = ["--set", f"training.max_steps={STEPS}", "--set", f"checkpoint.every={STEPS}"]
    argv = shlex.split(commands[0])
    assert argv[-2:] == ["--nproc", "4"]
    train(job_file, 4, *steps, "--set", f"run.output_dir={root / 'tp'}")
    # The same file on one process, in this one (its imports are done: seconds, not tens).
    one = ["--set", "strategy.name=none", "--set", "strategy.tensor_parallel=1"]
    with contextlib.redirect_stdout(io.StringIO()):
        out_dir = ["--set", f"run.output_dir={root / 'one'}"]
        code = main(["train", str(job_file), *steps, *one, *out_dir])
    assert code == 0
    two_d, reference = _weights(root / "tp"), _weights(root / "one")
    assert two_d.keys() == reference.keys()
    diff = max((two_d[k].double() - reference[k].double()).abs().max().item() for k in two_d)
    assert diff <= TOL, f"plan's 2-D job vs one process: max |dw| {diff:.2e}"
    manifest = root / "tp" / "checkpoints" / f"step-{STEPS:08d}" / "manifest.json"
    assert json.loads(manifest.read_text())["config"]["strategy"]["tensor_parallel"] == 2


def test_plan_sizes_the_2d_layout_by_the_models_own_plan(llama: dict[str, Any]) -> None:
    """The 2-D row keeps whole what the plan does not split: more than FSDP's 1/4 each."""
    code, out, err = _plan([*llama["argv"], "--tensor-parallel", "2", "--json"])
    assert code == 0, err
    r = json.loads(out)
    flat, two_d = r["candidates"]["fsdp"], r["candidates"]["fsdp+tp2"]
    # Llama's plan splits q/k/v/o and the MLP: 2 x (4 x 32 x 32 + 3 x 32 x 64) = 20,480 of
    # 2 x 512 x 32 (embedding, untied head) + 20,480 + 5 x 32 (norms) = 53,408 parameters;
    # the rest stay whole, each held by 2 of the 4 GPUs: (0.383 + 0.617 x 2) x FSDP's quarter.
    share = 20_480 / 53_408
    expected = flat["parameters"] * (share + (1 - share) * 2)
    assert two_d["parameters"] == pytest.approx(expected, rel=1e-3)
    assert r["recommended"]["strategy_config"] == {"name": "fsdp", "tensor_parallel": 2}


def test_a_job_files_own_tp_plan_is_what_plan_sizes(tmp_path: Path) -> None:
    """A user's model that ships no plan, with one in its job file (the MLP only): plan
    takes it, keeps the rest whole, and its launch keeps the job's plan."""
    import tp_jobs

    plan = {"blocks.*.mlp.c_fc": "colwise", "blocks.*.mlp.c_proj": "rowwise"}
    strategy = {"name": "fsdp", "tp_plan": plan}
    job = tp_jobs.job_file(tmp_path, "user", strategy, model="tp_jobs:planless_model")
    four = ["--gpu-memory", "16", "--gpus", "4", "--tensor-parallel", "2"]
    code, out, err = _plan([str(job), *four, "--json"])
    assert code == 0, err
    r = json.loads(out)
    assert r["launch"] == [
        f"gpu-training train {job} --nproc 4 --set strategy.name=fsdp --set "
        "strategy.tensor_parallel=2 --set training.per_device_batch_size="
        f"{r['batch']['per_device']} --set training.global_batch_size={r['batch']['global']}"
    ]
    # The MLP: 2 x 16 x 64 = 2,048 of the 1 x 16-wide model's 3,504 parameters (biasless;
    # the tied embedding 72 x 16, positions 16 x 16, attention 4 x 16 x 16, 3 norms of 16).
    share = 2_048 / (72 * 16 + 16 * 16 + 4 * 16 * 16 + 2_048 + 3 * 16)
    flat, two_d = r["candidates"]["fsdp"], r["candidates"]["fsdp+tp2"]
    expected = flat["parameters"] * (share + (1 - share) * 2)
    assert two_d["parameters"] == pytest.approx(expected, rel=1e-2)
    planless = tp_jobs.job_file(tmp_path, "none", {"name": "fsdp"}, model="tp_jobs:planless_model")
    code, out, err = _plan([str(planless), *four])
    assert (
        code == 2 and "ships no tensor-parallel plan" in err and len(err.strip().splitlines()) == 1
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["tp_jobs:planless_model", "--data", "masked_task:data"],
            "CharTransformer ships no tensor-parallel plan",
        ),
        (
            ["charlm", "--task-option", "n_head=2", "--task-option", "n_embd=32"],
            "2 attention heads",
        ),
    ],
    ids=["no-plan", "heads"],
)
def test_a_model_the_plan_cannot_split_is_one_line_exit_2(argv: list[str], message: str) -> None:
    code, out, err = _plan([*argv, "--gpu-memory", "16", "--gpus", "4", "--tensor-parallel", "4"])
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert message in lines[0] and "--tensor-parallel 4" in lines[0], err
