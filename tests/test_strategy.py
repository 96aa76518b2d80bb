"""gpu_training.strategy: specs, block detection, wrapping parity, the decision tree, configs.

The parity tests train the built-in character transformer (3 identical blocks, weight tying)
for a few AdamW steps with accumulation and active clipping on 2 gloo ranks, under DDP and
FSDP2 (with and without activation checkpointing, hybrid, CPU offload, bf16), and compare the
weights with one process training on the same global batches. Every case runs inside one
2-rank launch; each test below judges one case.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from dist_harness import REPO_ROOT, run_ranks
from gpu_training.config import ConfigError, TrainingConfig, read_config_file
from gpu_training.ddp import DistributedContext, cleanup_distributed, init_distributed
from gpu_training.strategy import (
    CANDIDATES,
    ModelStateBytes,
    StrategyConfig,
    StrategyError,
    apply_activation_checkpointing,
    build_deepspeed_config,
    choose_strategy,
    detect_blocks,
    find_auto_values,
    find_blocks,
    model_state_bytes,
    parse_strategy,
    prepare,
    wrap_model,
)

pytestmark = pytest.mark.timeout(240)

CONFIGS = REPO_ROOT / "configs"
GIB = 2**30
PARITY_TOL = 1e-5  # fp32: max |w_2 ranks - w_1 process| after 4 AdamW steps (measured ~1e-7)
BF16_TOL = 3e-2  # FSDP bf16 compute vs the fp32 single process, same steps


# --- models -------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Net(nn.Module):
    def __init__(self, depth: int = 3, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Linear(4, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


# --- spec ---------------------------------------------------------------------------------


def test_parse_strategy_accepts_names_mappings_and_dataclasses() -> None:
    assert parse_strategy(None) == StrategyConfig(name="ddp")
    assert parse_strategy("fsdp").name == "fsdp"
    spec = parse_strategy({"name": "fsdp", "block_classes": ["Block"], "sharding": "hybrid"})
    assert spec.block_classes == ("Block",) and spec.sharding == "hybrid"
    assert StrategyConfig.from_dict(spec.to_dict()) == spec

    @dataclasses.dataclass
    class OtherSpec:  # e.g. the job file's strategy section
        name: str = "deepspeed"
        zero_stage: int = 3
        cpu_offload: bool = True

    assert parse_strategy(OtherSpec()) == StrategyConfig(
        name="deepspeed", zero_stage=3, cpu_offload=True
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("fdsp", "unknown strategy 'fdsp' (did you mean 'fsdp'?); expected one of none, ddp"),
        ({"name": "ddp", "sharing": "full"}, "unknown field 'strategy.sharing' (did you mean"),
        (
            {"name": "fsdp", "sharding": "hybird"},
            "'strategy.sharding': expected one of full, hybrid",
        ),
        ({"name": "fsdp", "block_classes": []}, "'strategy.block_classes': expected a non-empty"),
        ({"name": "fsdp", "activation_checkpointing": "yes"}, "expected true or false"),
        ({"name": "deepspeed", "zero_stage": 4}, "'strategy.zero_stage': expected 1, 2 or 3"),
        ({"name": "deepspeed", "zero_stage": 2, "offload": "all"}, "needs zero_stage 3"),
        ({"name": "deepspeed", "offload": "gpu"}, "'strategy.offload': expected one of none"),
        (42, "expected a name or a mapping"),
    ],
)
def test_strategy_errors_are_one_line_with_a_hint(value: Any, message: str) -> None:
    with pytest.raises(StrategyError) as info:
        parse_strategy(value)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)


# --- block detection ----------------------------------------------------------------------


def test_find_blocks_by_name_qualified_name_and_class_set() -> None:
    model = Net(depth=3)
    expected = ["blocks.0", "blocks.1", "blocks.2"]
    assert [n for n, _ in find_blocks(model, "Block")] == expected
    assert [n for n, _ in find_blocks(model, f"{Block.__module__}.Block")] == expected
    assert [n for n, _ in find_blocks(model, {Block})] == expected
    # Outermost matches only: the Linears inside each block's MLP are not separate units.
    assert [n for n, _ in find_blocks(model, {"Block", "Linear"})] == [
        "embed",
        *expected,
        "head",
    ]


def test_find_blocks_names_the_missing_class_and_the_close_match() -> None:
    with pytest.raises(StrategyError) as info:
        find_blocks(Net(), ["Block", "Blok"])
    text = str(info.value)
    assert "block class 'Blok' not found in the model (did you mean 'Block'?)" in text
    assert "its classes are: Block, GELU, LayerNorm, Linear, ModuleList, Net, Sequential" in text
    with pytest.raises(StrategyError, match="'Conv2d' not found"):
        find_blocks(Net(), {nn.Conv2d})
    with pytest.raises(StrategyError, match="'Net' is the model itself"):
        find_blocks(Net(), "Net")


def test_detect_blocks_picks_the_largest_repeated_group() -> None:
    # Each block's MLP holds two Linears too; the block stack covers more parameters.
    assert [n for n, _ in detect_blocks(Net(depth=3))] == ["blocks.0", "blocks.1", "blocks.2"]
    seq = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 8), nn.Linear(8, 2))
    assert [n for n, _ in detect_blocks(seq)] == ["0", "2", "3"]


def test_detect_blocks_without_repeats_is_a_clear_error() -> None:
    model = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.LayerNorm(8))
    with pytest.raises(StrategyError, match="no repeated blocks found") as info:
        detect_blocks(model)
    assert "block_classes" in str(info.value) and "LayerNorm, Linear" in str(info.value)


# --- activation checkpointing and single-process wrapping -----------------------------------


def _grads(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(x).pow(2).mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_activation_checkpointing_keeps_keys_outputs_and_gradients() -> None:
    torch.manual_seed(0)
    plain = Net()
    ckpt = copy.deepcopy(plain)
    wrappers = apply_activation_checkpointing(ckpt, find_blocks(ckpt, "Block"))
    assert len(wrappers) == 3 and all(type(w).__name__ == "CheckpointWrapper" for w in wrappers)
    assert list(ckpt.state_dict()) == list(plain.state_dict())  # prefix dropped on save
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(5, 4)
    assert torch.equal(ckpt(x), plain(x))
    g_plain = _grads(plain, x)
    g_ckpt = {k.replace("._checkpoint_wrapped_module", ""): v for k, v in _grads(ckpt, x).items()}
    assert g_ckpt.keys() == g_plain.keys()
    for name, grad in g_plain.items():
        assert torch.equal(g_ckpt[name], grad), name
    # Applying it twice wraps nothing twice.
    again = apply_activation_checkpointing(ckpt, find_blocks(ckpt, "CheckpointWrapper"))
    assert again == wrappers


def test_wrap_model_in_one_process() -> None:
    ctx = DistributedContext()
    model = Net()
    assert wrap_model(model, "none", ctx, device="cpu") is model
    # No process group in one process: nothing to replicate or shard.
    assert wrap_model(model, "ddp", ctx, device="cpu") is model
    assert wrap_model(model, "fsdp", ctx, device="cpu") is model
    wrapped = wrap_model(Net(), "none", ctx, device="cpu", activation_checkpointing=True)
    assert type(wrapped.blocks[0]).__name__ == "CheckpointWrapper"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"strategy": "deepspeed"},
            StrategyError,
            "use gpu_training.strategy.deepspeed_initialize",
        ),
        ({"strategy": "dpp"}, StrategyError, "did you mean 'ddp'"),
        ({"strategy": "fsdp", "block_classes": "Blocks"}, StrategyError, "did you mean 'Block'"),
        (
            {"strategy": "none", "activation_checkpointing": True, "block_classes": "Conv1d"},
            StrategyError,
            "'Conv1d' not found",
        ),
        ({"strategy": "fsdp", "sharding": "hybird"}, StrategyError, "did you mean 'hybrid'"),
        (
            {"strategy": "fsdp", "sharding": "hybrid", "ctx": DistributedContext(0, 0, 6, 4)},
            StrategyError,
            "world size (6) must be a multiple of the ranks per node",
        ),
        (
            {"strategy": "ddp", "ctx": DistributedContext(0, 0, 2, 2)},
            RuntimeError,
            "call gpu_training.ddp.init_distributed",
        ),
    ],
)
def test_wrap_model_errors(kwargs: dict[str, Any], error: type, message: str) -> None:
    ctx = kwargs.pop("ctx", DistributedContext())
    strategy = kwargs.pop("strategy")
    with pytest.raises(error) as info:
        wrap_model(Net(), strategy, ctx, device="cpu", **kwargs)
    assert message in str(info.value)


def test_no_repeated_blocks_is_an_error_for_fsdp_auto_detection() -> None:
    # Detection happens before the process-group check, so one process shows it too.
    with pytest.raises(StrategyError, match="no repeated blocks found"):
        wrap_model(nn.Linear(2, 2), "fsdp", DistributedContext(), activation_checkpointing=True)


def test_prepare_refuses_fsdp_with_fp16() -> None:
    cfg = TrainingConfig(per_device_batch_size=2, precision="fp16")
    with pytest.raises(StrategyError, match="fsdp with fp16"):
        prepare(Net(), "fsdp", DistributedContext(), cfg, device="cpu")


def test_prepare_none_trains_like_a_hand_written_loop() -> None:
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    cfg = TrainingConfig(
        per_device_batch_size=4,
        gradient_accumulation_steps=2,
        precision="fp32",
        learning_rate=1e-2,
        max_grad_norm=0.1,
    )
    run = prepare(model, "none", DistributedContext(), cfg, device="cpu")
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
        norms = []
        for micro in range(2):
            with run.steps.sync(micro), run.steps.autocast():
                part = slice(4 * micro, 4 * micro + 4)
                loss = nn.functional.mse_loss(run.model(x[part]), y[part])
            run.steps.backward(loss)
            norms.append(run.steps.step(micro))
        nn.functional.mse_loss(reference(x), y).backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.1)
        ref_opt.step()
        ref_opt.zero_grad()
        assert norms[0] is None and norms[1] == pytest.approx(float(ref_norm), rel=1e-5)
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert (a - b).abs().max().item() <= PARITY_TOL


# --- the decision tree ----------------------------------------------------------------------


def test_gpt2_small_and_xl_on_8x80gb_use_ddp() -> None:
    for params in (124_000_000, 1_558_000_000):
        choice = choose_strategy(params, gpu_memory_bytes=80 * GIB, num_gpus=8)
        assert (choice.strategy, choice.fits, choice.zero_stage) == ("ddp", True, None)
        assert "fits one GPU" in choice.reason and "DDP" in choice.reason
    xl = choose_strategy(1_558_000_000, gpu_memory_bytes=80 * GIB, num_gpus=8)
    assert xl.per_gpu_bytes["ddp"] == 16 * 1_558_000_000  # 2 + 2 + (4 + 8) bytes per parameter
    assert "23.2 GiB <= 79.5 GiB" in xl.reason
    single = choose_strategy(124_000_000, gpu_memory_bytes=80 * GIB, num_gpus=1)
    assert single.strategy == "none" and "nothing to distribute" in single.reason


def test_llama_7b_on_8x80gb_uses_fsdp() -> None:
    choice = choose_strategy(6_738_000_000, gpu_memory_bytes=80 * GIB, num_gpus=8)
    assert (choice.strategy, choice.fits, choice.offload) == ("fsdp", True, "none")
    assert choice.per_gpu_bytes["ddp"] > choice.usable_bytes >= choice.per_gpu_bytes["fsdp"]
    assert "100.4 GiB > 79.5 GiB" in choice.reason and "12.6 GiB per GPU" in choice.reason
    assert "under 10B params: FSDP" in choice.reason
    assert choice.to_strategy_config() == StrategyConfig(name="fsdp")


def test_70b_on_8x80gb_needs_offload_or_more_gpus() -> None:
    choice = choose_strategy(70_000_000_000, gpu_memory_bytes=80 * GIB, num_gpus=8)
    assert (choice.strategy, choice.zero_stage, choice.offload) == ("deepspeed", 3, "optimizer")
    assert choice.fits
    assert "full sharding alone does not fit" in choice.reason
    assert "130.4 GiB per GPU > 79.5 GiB" in choice.reason
    # 1043.1 GiB of state / 79.5 GiB usable per GPU -> 14 GPUs.
    assert choice.min_gpus == 14 and ">= 14 GPUs" in choice.reason
    check = choose_strategy(70_000_000_000, gpu_memory_bytes=80 * GIB, num_gpus=14)
    assert check.strategy == "fsdp" and "10B-100B" in check.reason
    spec = choice.to_strategy_config()
    assert (spec.name, spec.zero_stage, spec.offload) == ("deepspeed", 3, "optimizer")


def test_decision_tree_edges() -> None:
    # Over 100B with enough GPUs: the guide's ZeRO-3 + offload, and the reason says sharding fits.
    big = choose_strategy(200_000_000_000, gpu_memory_bytes=80 * GIB, num_gpus=64)
    assert (big.strategy, big.offload) == ("deepspeed", "optimizer")
    assert "full sharding alone would also fit" in big.reason
    # Nothing fits: say so and how many GPUs would.
    huge = choose_strategy(175_000_000_000, gpu_memory_bytes=80 * GIB, num_gpus=8)
    assert not huge.fits and huge.min_gpus == 33 and "does not fit" in huge.reason
    # Activations count per GPU and are not sharded.
    act = choose_strategy(
        1_000_000_000, gpu_memory_bytes=24 * GIB, num_gpus=4, activation_bytes=10 * GIB
    )
    assert act.per_gpu_bytes["fsdp"] == 4 * 10**9 + 10 * GIB and act.strategy == "fsdp"
    none_fit = choose_strategy(
        10**9, gpu_memory_bytes=8 * GIB, num_gpus=2, activation_bytes=9 * GIB
    )
    assert not none_fit.fits and none_fit.min_gpus is None
    assert "activations alone" in none_fit.reason
    # One GPU too small: ZeRO-Offload, not FSDP.
    one = choose_strategy(3_000_000_000, gpu_memory_bytes=24 * GIB, num_gpus=1)
    assert (one.strategy, one.offload) == ("deepspeed", "optimizer") and "One GPU" in one.reason
    assert set(one.per_gpu_bytes) == set(CANDIDATES)


def test_memory_estimate_is_a_replaceable_input() -> None:
    fp32 = model_state_bytes(10**9, "fp32", "adamw")
    assert (fp32.weights, fp32.gradients, fp32.optimizer) == (4 * 10**9, 4 * 10**9, 8 * 10**9)
    assert model_state_bytes(10**9, "bf16", "sgd_momentum").total == 12 * 10**9
    assert model_state_bytes(10**9, "fp32", 0).total == 8 * 10**9
    tiny = ModelStateBytes(weights=1, gradients=1, optimizer=1)
    choice = choose_strategy(
        70_000_000_000, gpu_memory_bytes=80 * GIB, num_gpus=8, state_bytes=tiny
    )
    assert choice.strategy == "ddp"
    with pytest.raises(StrategyError, match="did you mean 'adamw'"):
        model_state_bytes(10, "fp32", "adamww")
    with pytest.raises(StrategyError, match="precision must be"):
        model_state_bytes(10, "fp8")
    with pytest.raises(StrategyError, match="num_gpus must be an integer >= 1"):
        choose_strategy(10, gpu_memory_bytes=GIB, num_gpus=0)


# --- DeepSpeed config -----------------------------------------------------------------------


def _tc(**kw: Any) -> TrainingConfig:
    base: dict[str, Any] = {
        "per_device_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "world_size": 2,
        "learning_rate": 1e-3,
        "precision": "fp32",
        "max_grad_norm": 1.0,
        "weight_decay": 0.1,
    }
    return TrainingConfig(**{**base, **kw})


def test_shipped_deepspeed_config_gets_every_auto_filled() -> None:
    raw = json.loads((CONFIGS / "deepspeed_config.json").read_text())
    assert raw["zero_optimization"]["stage"] == 2
    assert len(find_auto_values(raw)) >= 6  # the guide's "auto" placeholders
    ds = build_deepspeed_config(CONFIGS / "deepspeed_config.json", _tc(), hidden_size=64)
    assert find_auto_values(ds) == []
    assert ds["train_batch_size"] == 16 and ds["train_micro_batch_size_per_gpu"] == 4
    assert ds["gradient_accumulation_steps"] == 2 and ds["gradient_clipping"] == 1.0
    assert ds["bf16"]["enabled"] is False and ds["fp16"]["enabled"] is False
    assert ds["zero_optimization"]["reduce_bucket_size"] == 64 * 64
    bf16 = build_deepspeed_config(CONFIGS / "deepspeed_config.json", _tc(precision="bf16"))
    assert bf16["bf16"]["enabled"] is True and "reduce_bucket_size" not in bf16["zero_optimization"]
    assert raw == json.loads((CONFIGS / "deepspeed_config.json").read_text())  # file untouched


def test_build_deepspeed_config_fills_optimizer_scheduler_and_offload() -> None:
    base = {
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        },
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": "auto",
                "warmup_max_lr": "auto",
                "warmup_num_steps": "auto",
                "total_num_steps": "auto",
            },
        },
        "zero_optimization": {"stage": "auto", "stage3_max_live_parameters": "auto"},
    }
    tc = _tc(base_batch_size=8, warmup_steps=5, max_steps=50, max_grad_norm=None)
    ds = build_deepspeed_config(base, tc, stage=3, offload=True, cpu_adam=True)
    assert ds["optimizer"]["params"] == {
        "lr": pytest.approx(2e-3),
        "betas": [0.9, 0.999],
        "eps": 1e-8,
        "weight_decay": 0.1,
    }
    assert ds["scheduler"]["params"] == {
        "warmup_min_lr": 0.0,
        "warmup_max_lr": pytest.approx(2e-3),
        "warmup_num_steps": 5,
        "total_num_steps": 50,
    }
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3 and "stage3_max_live_parameters" not in zero
    assert zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]["device"] == "cpu"
    assert zero["offload_optimizer"]["pin_memory"] is torch.cuda.is_available()
    assert ds["gradient_clipping"] == 0.0  # max_grad_norm None: no clipping
    # Offload without an optimizer section: the toolkit's torch optimizer runs on CPU state.
    plain = build_deepspeed_config(None, _tc(), stage=2, offload="optimizer", cpu_adam=False)
    assert plain["zero_force_ds_cpu_optimizer"] is False and "optimizer" not in plain
    assert "offload_param" not in plain["zero_optimization"]
    added = build_deepspeed_config(None, _tc(), stage=2, offload="optimizer", cpu_adam=True)
    assert added["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.999], "eps": 1e-8},
    }
    # The strategy's stage and offload override the template.
    zero1 = build_deepspeed_config(added, _tc(), stage=1, offload=False)["zero_optimization"]
    assert zero1["stage"] == 1 and zero1["offload_optimizer"]["device"] == "none"


@pytest.mark.parametrize(
    ("base", "kwargs", "message"),
    [
        (
            {"activation_checkpointing": {"partition_activations": "auto"}},
            {},
            "cannot fill \"auto\" at 'activation_checkpointing.partition_activations'",
        ),
        (
            {"train_micro_batch_size_per_gpu": 8},
            {},
            "'train_micro_batch_size_per_gpu' is 8 but per_device_batch_size gives 4",
        ),
        ({"train_batch_size": 32}, {}, "'train_batch_size' is 32 but the effective batch size"),
        ({"gradient_clipping": 0.5}, {}, "'gradient_clipping' is 0.5 but max_grad_norm gives 1.0"),
        (
            {"bf16": {"enabled": True}},
            {},
            "'bf16.enabled' is True but precision 'fp32' gives False",
        ),
        ({"optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}, {}, "'optimizer.params.lr'"),
        (
            {"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}},
            {},
            "total_num_steps' is \"auto\" but the run's length is unknown",
        ),
        ({}, {"stage": 2, "offload": "all"}, "parameter offload"),
        ({}, {"offload": "optimiser"}, "did you mean 'optimizer'"),
        ({"zero_optimization": []}, {}, "'zero_optimization' must be a mapping"),
        ("missing.json", {}, "no such config file"),
    ],
)
def test_build_deepspeed_config_errors(
    base: Any, kwargs: dict[str, Any], message: str, tmp_path: Path
) -> None:
    if isinstance(base, str):
        base = tmp_path / base
    with pytest.raises(StrategyError) as info:
        build_deepspeed_config(base, _tc(), **kwargs)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


# --- shipped configs ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ddp_config.yaml", "fsdp_config.yaml", "deepspeed_job.yaml"])
def test_shipped_yaml_configs_validate(name: str) -> None:
    data = read_config_file(CONFIGS / name)
    assert {"task", "training", "strategy", "checkpoint"} <= set(data)
    training = TrainingConfig.from_dict(data["training"], source=name)
    assert training.for_world_size(2).effective_batch_size == data["training"]["global_batch_size"]
    spec = parse_strategy(data["strategy"], source=name)
    assert spec.name == name.split("_")[0]
    if spec.name == "deepspeed":  # its JSON is found next to it, and fills completely
        ds = build_deepspeed_config(
            CONFIGS / str(spec.deepspeed_config), training.for_world_size(2), stage=spec.zero_stage
        )
        assert not find_auto_values(ds) and ds["zero_optimization"]["stage"] == spec.zero_stage
    if spec.name == "fsdp":
        assert spec.block_classes == ("Block",) and training.precision == "bf16"
        # The blocks named there exist in the built-in task's model.
        from gpu_training.tasks.charlm import CharLMConfig, CharTransformer

        model = CharTransformer(CharLMConfig(**data["task_options"]), vocab_size=72)
        assert len(find_blocks(model, spec.block_classes)) == data["task_options"]["n_layer"]
    job_module = pytest.importorskip("gpu_training.job")
    job = job_module.load_job(CONFIGS / name)
    from_job = parse_strategy(job.strategy)
    for key in data["strategy"]:
        if key != "deepspeed_config":  # resolved against the job file's directory
            assert getattr(from_job, key) == getattr(spec, key), key
    if spec.deepspeed_config is not None:
        assert Path(str(from_job.deepspeed_config)).is_file()


# --- multi-rank parity ----------------------------------------------------------------------

_CASES: dict[str, dict[str, Any]] = {
    "ddp": {"strategy": {"name": "ddp"}},
    "ddp_ac": {"strategy": {"name": "ddp", "activation_checkpointing": True}},
    "fsdp": {"strategy": {"name": "fsdp", "block_classes": ["Block"]}},
    "fsdp_ac": {"strategy": {"name": "fsdp", "activation_checkpointing": True}},  # auto-detected
    "fsdp_hybrid": {"strategy": {"name": "fsdp", "sharding": "hybrid"}, "nodes": 2},
    "fsdp_offload": {"strategy": {"name": "fsdp", "cpu_offload": True}},
    "fsdp_bf16": {"strategy": {"name": "fsdp", "activation_checkpointing": True}, "bf16": True},
}
_STEPS, _PER_DEVICE, _ACCUM, _CLIP, _LR = 4, 2, 2, 0.5, 3e-3


def _full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every rank calls this: FSDP's DTensors are gathered (a collective)."""
    out = {}
    for key, value in model.state_dict().items():
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[key.removeprefix("module.")] = full.detach().float().clone()
    return out


def _parity_worker(labels: list[str]) -> dict[str, Any]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from gpu_training.tasks.charlm import CharLMConfig, CharTransformer, build_datasets, loss_fn

    ctx = init_distributed()
    try:
        data = build_datasets(block_size=16)
        vocab = data.tokenizer.vocab_size
        shape = CharLMConfig(block_size=16, n_layer=3, n_head=2, n_embd=32)
        world = ctx.world_size
        global_batch = _PER_DEVICE * _ACCUM * world
        results: dict[str, Any] = {}
        for label in labels:
            case = _CASES[label]
            torch.manual_seed(0)
            model = CharTransformer(shape, vocab)
            reference = copy.deepcopy(model)
            cfg = TrainingConfig(
                per_device_batch_size=_PER_DEVICE,
                gradient_accumulation_steps=_ACCUM,
                world_size=world,
                learning_rate=_LR,
                max_grad_norm=_CLIP,
                precision="bf16" if case.get("bf16") else "fp32",
            )
            run_ctx = ctx
            if case.get("nodes"):  # pretend each rank is its own node: replicate x shard = 2 x 1
                run_ctx = dataclasses.replace(ctx, local_rank=0, local_world_size=world // 2)
            run = prepare(model, case["strategy"], run_ctx, cfg, device="cpu")
            ref_opt = torch.optim.AdamW(reference.parameters(), lr=_LR, weight_decay=0.0)
            norms, ref_norms = [], []
            for step in range(_STEPS):
                start = step * global_batch
                xs, ys = zip(
                    *(data.train[i] for i in range(start, start + global_batch)), strict=True
                )
                x, y = torch.stack(xs), torch.stack(ys)
                mine = slice(ctx.rank * _PER_DEVICE * _ACCUM, (ctx.rank + 1) * _PER_DEVICE * _ACCUM)
                for micro in range(_ACCUM):
                    part = slice(
                        mine.start + micro * _PER_DEVICE, mine.start + (micro + 1) * _PER_DEVICE
                    )
                    with run.steps.sync(micro):
                        with run.steps.autocast():
                            loss = loss_fn(run.model(x[part]), y[part])
                        run.steps.backward(loss)
                    norm = run.steps.step(step * _ACCUM + micro)
                    assert (norm is None) == (micro < _ACCUM - 1)
                norms.append(norm)
                loss_fn(reference(x), y).backward()  # the whole global batch, one process
                ref_norms.append(
                    float(torch.nn.utils.clip_grad_norm_(reference.parameters(), _CLIP))
                )
                ref_opt.step()
                ref_opt.zero_grad()
            state = _full_state(run.model)
            ref_state = reference.state_dict()
            assert state.keys() == ref_state.keys(), sorted(set(state) ^ set(ref_state))
            results[label] = {
                "diff": max((state[k] - v).abs().max().item() for k, v in ref_state.items()),
                "norms": norms,
                "ref_norms": ref_norms,
                "kind": type(run.model).__name__,
                "checkpointed": sum(isinstance(m, CheckpointWrapper) for m in run.model.modules()),
                "checksum": sum(v.double().sum().item() for v in state.values()),
            }
            del run, model  # drop DDP's reducer before the group goes (docs/design.md, "Traps")
        return results
    finally:
        cleanup_distributed()


@pytest.fixture(scope="module")
def parity() -> list[dict[str, Any]]:
    return run_ranks(_parity_worker, 2, args=(list(_CASES),), timeout=200)


@pytest.mark.multirank
@pytest.mark.parametrize(
    ("label", "kind", "checkpointed"),
    [
        ("ddp", "DistributedDataParallel", 0),
        ("ddp_ac", "DistributedDataParallel", 3),
        ("fsdp", "FSDPCharTransformer", 0),
        ("fsdp_ac", "FSDPCharTransformer", 3),
        ("fsdp_hybrid", "FSDPCharTransformer", 0),
        ("fsdp_offload", "FSDPCharTransformer", 0),
    ],
)
def test_two_ranks_match_one_process(
    parity: list[dict[str, Any]], label: str, kind: str, checkpointed: int
) -> None:
    for rank, results in enumerate(parity):
        r = results[label]
        assert r["kind"] == kind and r["checkpointed"] == checkpointed
        assert r["diff"] <= PARITY_TOL, f"{label} rank {rank}: weights differ by {r['diff']:.2e}"
        # The gradient norm the step reports is the global one (clipping was active).
        assert r["norms"] == pytest.approx(r["ref_norms"], rel=1e-4)
        assert max(r["ref_norms"]) > _CLIP
    assert parity[0][label]["checksum"] == parity[1][label]["checksum"], "ranks diverged"


@pytest.mark.multirank
def test_fsdp_bf16_stays_close_to_fp32(parity: list[dict[str, Any]]) -> None:
    r = parity[0]["fsdp_bf16"]
    assert r["kind"] == "FSDPCharTransformer" and r["checkpointed"] == 3
    assert 0 < r["diff"] <= BF16_TOL, f"bf16 vs fp32: {r['diff']:.2e}"
    assert r["norms"] == pytest.approx(r["ref_norms"], rel=5e-2)


@pytest.mark.parametrize("module", ["__init__", "spec", "choose", "wrap", "deepspeed"])
def test_docstring_examples_run(module: str) -> None:
    import doctest
    import importlib

    name = "gpu_training.strategy" + ("" if module == "__init__" else f".{module}")
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0, name
