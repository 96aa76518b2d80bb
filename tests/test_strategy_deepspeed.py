"""DeepSpeed ZeRO 1/2/3 (and CPU offload) on 2 CPU gloo ranks, against one process.

The built-in character transformer trains a few steps with accumulation, active clipping and
an LR warmup driven through ``Prepared.optimizer``; its weights must match a single process
training on the same global batches. The DeepSpeed config is the shipped
``configs/deepspeed_config.json`` with its ``"auto"`` values filled by the toolkit.

DeepSpeed builds no C++ op here: the optimizer is a torch AdamW and the CPU shared-memory
comm op (inference only) is skipped, so the whole module runs in well under a minute.
"""

from __future__ import annotations

import copy
from importlib.util import find_spec
from typing import Any

import pytest
import torch

from dist_harness import REPO_ROOT, run_ranks
from gpu_training.config import TrainingConfig
from gpu_training.ddp import cleanup_distributed, init_distributed
from gpu_training.strategy import StrategyError, deepspeed_initialize, prepare

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.multirank,
    # find_spec, not import: importing DeepSpeed into the pytest process costs seconds.
    pytest.mark.skipif(find_spec("deepspeed") is None, reason="needs the deepspeed extra"),
]

DS_CONFIG = REPO_ROOT / "configs" / "deepspeed_config.json"
PARITY_TOL = 1e-5  # fp32, 4 AdamW steps; see test_strategy.py for where the ~2e-6 comes from
_CASES: dict[str, dict[str, Any]] = {
    "zero1": {"name": "deepspeed", "zero_stage": 1},
    "zero2": {"name": "deepspeed", "zero_stage": 2},
    "zero3": {"name": "deepspeed", "zero_stage": 3},
    "zero2_offload": {"name": "deepspeed", "zero_stage": 2, "offload": "optimizer"},
    "zero3_offload_all": {"name": "deepspeed", "zero_stage": 3, "cpu_offload": True},
    "zero3_ac": {"name": "deepspeed", "zero_stage": 3, "activation_checkpointing": True},
}
_STEPS, _PER_DEVICE, _ACCUM, _CLIP, _LR = 4, 2, 2, 0.5, 3e-3


def _warmup(step: int) -> float:
    return min(1.0, (step + 1) / 3)


def _deepspeed_worker(labels: list[str]) -> dict[str, Any]:
    import deepspeed
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from gpu_training.tasks.charlm import CharLMConfig, CharTransformer, build_datasets, loss_fn

    ctx = init_distributed()
    try:
        data = build_datasets(block_size=16)
        shape = CharLMConfig(block_size=16, n_layer=3, n_head=2, n_embd=32)
        world = ctx.world_size
        global_batch = _PER_DEVICE * _ACCUM * world
        results: dict[str, Any] = {}
        for label in labels:
            torch.manual_seed(0)
            model = CharTransformer(shape, data.tokenizer.vocab_size)
            reference = copy.deepcopy(model)
            cfg = TrainingConfig(
                per_device_batch_size=_PER_DEVICE,
                gradient_accumulation_steps=_ACCUM,
                world_size=world,
                learning_rate=_LR,
                max_grad_norm=_CLIP,
                precision="fp32",
            )
            strategy = {**_CASES[label], "deepspeed_config": str(DS_CONFIG)}
            run = prepare(model, strategy, ctx, cfg, device="cpu")
            schedule = torch.optim.lr_scheduler.LambdaLR(run.optimizer, _warmup)
            ref_opt = torch.optim.AdamW(reference.parameters(), lr=_LR, weight_decay=0.0)
            ref_schedule = torch.optim.lr_scheduler.LambdaLR(ref_opt, _warmup)
            norms, ref_norms = [], []
            for step in range(_STEPS):
                start = step * global_batch
                pairs = [data.train[i] for i in range(start, start + global_batch)]
                x = torch.stack([p[0] for p in pairs])
                y = torch.stack([p[1] for p in pairs])
                first = ctx.rank * _PER_DEVICE * _ACCUM
                for micro in range(_ACCUM):
                    part = slice(first + micro * _PER_DEVICE, first + (micro + 1) * _PER_DEVICE)
                    with run.steps.sync(micro), run.steps.autocast():
                        loss = loss_fn(run.model(x[part]), y[part])
                    run.steps.backward(loss)
                    norm = run.steps.step(step * _ACCUM + micro)
                    assert (norm is None) == (micro < _ACCUM - 1)
                norms.append(norm)
                schedule.step()
                loss_fn(reference(x), y).backward()
                ref_norms.append(
                    float(torch.nn.utils.clip_grad_norm_(reference.parameters(), _CLIP))
                )
                ref_opt.step()
                ref_opt.zero_grad()
                ref_schedule.step()
            module = run.model.module
            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                state = {k: v.detach().clone() for k, v in module.state_dict().items()}
            ref_state = reference.state_dict()
            assert state.keys() == ref_state.keys()
            zero = run.deepspeed_config["zero_optimization"] if run.deepspeed_config else {}
            results[label] = {
                "diff": max((state[k] - v).abs().max().item() for k, v in ref_state.items()),
                "norms": norms,
                "ref_norms": ref_norms,
                "stage": zero.get("stage"),
                "offload": [
                    (zero.get(k) or {}).get("device", "none")
                    for k in ("offload_optimizer", "offload_param")
                ],
                "optimizer": type(run.engine.optimizer).__name__,
                "checkpointed": sum(
                    isinstance(m, CheckpointWrapper) for m in run.model.module.modules()
                ),
                "lr": run.optimizer.param_groups[0]["lr"],
                "checksum": sum(v.double().sum().item() for v in state.values()),
            }
            del run, schedule
        return results
    finally:
        cleanup_distributed()


def _single_process_worker() -> dict[str, Any]:
    """A notebook: no launcher variables at all, so a private process group is created."""
    import os

    import torch.distributed as dist

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        os.environ.pop(name, None)
    ctx = init_distributed()  # one process: a no-op
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        cfg = TrainingConfig(per_device_batch_size=4, precision="fp32", learning_rate=0.05)
        errors = []
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(StrategyError) as info:
            prepare(model, "deepspeed", ctx, cfg, device="cpu", optimizer=lambda params: sgd)
        errors.append(str(info.value))
        run = prepare(model, {"name": "deepspeed", "zero_stage": 1}, ctx, cfg, device="cpu")
        x, y = torch.randn(4, 4), torch.randn(4, 2)
        before = torch.nn.functional.mse_loss(run.model(x), y).item()
        for _ in range(20):
            run.steps.backward(torch.nn.functional.mse_loss(run.model(x), y))
            run.steps.step(0)
        after = torch.nn.functional.mse_loss(run.model(x), y).item()
        adam = torch.optim.AdamW(model.parameters())
        ds_config = run.deepspeed_config or {}
        for config, optimizer in (
            ({**ds_config, "train_batch_size": 8}, adam),
            (ds_config, None),
            ({"train_batch_size": "auto"}, adam),
        ):
            with pytest.raises(StrategyError) as info:
                deepspeed_initialize(model, config, ctx, optimizer=optimizer)
            errors.append(str(info.value))
        grouped = dist.is_initialized() and dist.get_world_size() == 1
        del run
        return {"before": before, "after": after, "grouped": grouped, "errors": errors}
    finally:
        cleanup_distributed()


@pytest.fixture(scope="module")
def zero_runs() -> list[dict[str, Any]]:
    return run_ranks(_deepspeed_worker, 2, args=(list(_CASES),), timeout=220)


@pytest.mark.parametrize(
    ("label", "stage", "offload", "optimizer"),
    [
        ("zero1", 1, ["none", "none"], "DeepSpeedZeroOptimizer"),
        ("zero2", 2, ["none", "none"], "DeepSpeedZeroOptimizer"),
        ("zero3", 3, ["none", "none"], "DeepSpeedZeroOptimizer_Stage3"),
        ("zero2_offload", 2, ["cpu", "none"], "DeepSpeedZeroOptimizer"),
        ("zero3_offload_all", 3, ["cpu", "cpu"], "DeepSpeedZeroOptimizer_Stage3"),
        ("zero3_ac", 3, ["none", "none"], "DeepSpeedZeroOptimizer_Stage3"),
    ],
)
def test_zero_on_two_ranks_matches_one_process(
    zero_runs: list[dict[str, Any]], label: str, stage: int, offload: list[str], optimizer: str
) -> None:
    for rank, results in enumerate(zero_runs):
        r = results[label]
        assert (r["stage"], r["offload"], r["optimizer"]) == (stage, offload, optimizer)
        assert r["checkpointed"] == (3 if label.endswith("_ac") else 0)
        assert r["diff"] <= PARITY_TOL, f"{label} rank {rank}: weights differ by {r['diff']:.2e}"
        # DeepSpeed's reported norm is the global pre-clip norm; clipping was active.
        assert r["norms"] == pytest.approx(r["ref_norms"], rel=1e-4)
        assert max(r["ref_norms"]) > _CLIP
        # The LR schedule attached to Prepared.optimizer drove DeepSpeed's steps.
        assert r["lr"] == pytest.approx(_LR)
    assert zero_runs[0][label]["checksum"] == zero_runs[1][label]["checksum"], "ranks diverged"


def test_deepspeed_in_one_process_and_its_errors() -> None:
    (r,) = run_ranks(_single_process_worker, 1, timeout=120)
    assert r["grouped"] and r["after"] < 0.5 * r["before"]
    assert "DeepSpeed ZeRO is not tested with SGD" in r["errors"][0]
    assert "train_batch_size 8 != 4 per GPU x 1 accumulation x 1 ranks" in r["errors"][1]
    assert "no optimizer: pass optimizer=" in r["errors"][2]
    assert "still has \"auto\" at 'train_batch_size'" in r["errors"][3]


def _fp16_without_native_kernels_worker() -> dict[str, Any]:
    """One process on a CPU whose oneDNN has no native fp16 (AMD EPYC, older Intel): an fp16
    job starts and steps, and DeepSpeed's accelerator answers as before afterwards."""
    import os

    from deepspeed.accelerator import get_accelerator
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        os.environ.pop(name, None)
    CPU_Accelerator.is_fp16_supported = lambda self: False  # the CPU the machine drew
    ctx = init_distributed()
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        cfg = TrainingConfig(per_device_batch_size=4, precision="fp16", learning_rate=0.05)
        run = prepare(model, {"name": "deepspeed", "zero_stage": 2}, ctx, cfg, device="cpu")
        x, y = torch.randn(4, 4).half(), torch.randn(4, 2).half()  # DeepSpeed casts the model only
        for _ in range(3):
            run.steps.backward(torch.nn.functional.mse_loss(run.model(x), y))
            run.steps.step(0)
        dtypes = {str(p.dtype) for p in run.model.parameters()}
        return {
            "dtypes": sorted(dtypes),
            "fp16": bool((run.deepspeed_config or {})["fp16"]["enabled"]),
            "after": get_accelerator().is_fp16_supported(),
            "patched_left": "is_fp16_supported" in vars(get_accelerator()),
        }
    finally:
        cleanup_distributed()


def test_fp16_starts_on_a_cpu_without_native_fp16_kernels() -> None:
    """DeepSpeed refuses fp16 on such a CPU ("Type fp16 is not supported on your device"); the
    toolkit's CPU runs must not depend on the CPU model: the engine starts in fp16 and the
    accelerator's own answer is back once it has."""
    (r,) = run_ranks(_fp16_without_native_kernels_worker, 1, timeout=120)
    assert r["fp16"] and r["dtypes"] == ["torch.float16"]
    assert r["after"] is False and not r["patched_left"]
