"""ZeRO checkpoints read and written per parameter, checked against DeepSpeed's own view.

On 2 CPU ranks: a ZeRO-1, -2 and -3 engine trains two steps and saves; a fresh engine of
every other stage (ZeRO-2 and -3 with their optimizer offloaded, ZeRO-3 with its parameters
too) loads that checkpoint through
``CheckpointManager.load_into_deepspeed`` — per parameter, into its own partitions — and a
plain model with AdamW through ``load_resharded``. DeepSpeed's public getters
(``safe_get_full_fp32_param``, ``safe_get_full_optimizer_state``) then read back the same fp32
weights, and after one more step on both, the same weights and moments (within float
rounding: the stages sum gradients in another order). The same stage goes through
DeepSpeed's own load and is bitwise. Without its moments (a negative control) the step after
misses.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

import pytest
import torch

from dist_harness import run_ranks

pytestmark = [
    pytest.mark.multirank,
    pytest.mark.timeout(300),
    pytest.mark.skipif(find_spec("deepspeed") is None, reason="needs the deepspeed extra"),
]

_KEYS = ("exp_avg", "exp_avg_sq")


def _reshard_worker(root: str) -> dict[str, float]:
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    import gpu_training.checkpoint.zero_sink as zero_sink
    from gpu_training.checkpoint import CheckpointManager
    from gpu_training.checkpoint.formats import DEEPSPEED
    from gpu_training.checkpoint.zero_reshard import engine_layout
    from gpu_training.checkpoint.zero_source import zero_layout
    from gpu_training.config import TrainingConfig
    from gpu_training.ddp import cleanup_distributed, init_distributed
    from gpu_training.resume import capture_run_state
    from gpu_training.strategy import prepare
    from gpu_training.tasks.charlm import CharLMConfig, CharTransformer, build_datasets, loss_fn

    ctx = init_distributed()
    data = build_datasets(block_size=16)
    shape = CharLMConfig(block_size=16, n_layer=2, n_head=2, n_embd=32)
    cfg = TrainingConfig(
        per_device_batch_size=2, world_size=ctx.world_size, learning_rate=1e-2, precision="fp32"
    )

    def build(strategy: dict[str, Any], seed: int) -> Any:
        torch.manual_seed(seed)
        model = CharTransformer(shape, data.tokenizer.vocab_size)
        return prepare(model, strategy, ctx, cfg, device="cpu")

    def step(run: Any, index: int) -> None:
        pairs = [data.train[4 * index + 2 * ctx.rank + i] for i in range(2)]
        x, y = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        run.steps.backward(loss_fn(run.model(x), y))
        run.steps.step(index)

    def full(run: Any, moments: bool) -> dict[str, list[torch.Tensor]]:
        out = {}
        for name, p in run.engine.module.named_parameters():  # collectives: every rank
            values = [safe_get_full_fp32_param(p)]
            values += [safe_get_full_optimizer_state(p, k) for k in _KEYS] if moments else []
            out[name] = [v.detach().clone() for v in values]
        return out

    def gap(a: dict[str, list[torch.Tensor]], b: dict[str, list[torch.Tensor]]) -> float:
        assert a.keys() == b.keys()
        return max((x - y).abs().max().item() for k in a for x, y in zip(a[k], b[k], strict=True))

    targets = {
        "zero1": {"name": "deepspeed", "zero_stage": 1},
        "zero2": {"name": "deepspeed", "zero_stage": 2},
        "zero3": {"name": "deepspeed", "zero_stage": 3},
        "zero2off": {"name": "deepspeed", "zero_stage": 2, "offload": "optimizer"},
        "zero3off": {"name": "deepspeed", "zero_stage": 3, "offload": "optimizer"},
        "zero3all": {"name": "deepspeed", "zero_stage": 3, "offload": "all"},
    }
    results: dict[str, float] = {}
    try:
        ckpt = CheckpointManager(root, ctx=ctx, keep_last_n=None)
        for stage in (1, 2, 3):
            source = build(targets[f"zero{stage}"], 0)
            for index in range(2):
                step(source, index)
            DEEPSPEED.save(ckpt, source, capture_run_state(ctx, step=stage), {"n": 1})
            path = ckpt.directory / f"step-{stage:08d}"
            # which load runs: DeepSpeed's own only where the layout is the engine's
            layouts = {n: engine_layout(build(t, 1).engine) for n, t in targets.items()}
            results[f"zero{stage} layouts alike"] = float(
                sorted(n for n, lay in layouts.items() if lay == zero_layout(path))
                == [f"zero{stage}"]
            )
            saved = full(source, moments=True)
            step(source, 2)
            after = full(source, moments=True)
            for name, strategy in targets.items():
                run = build(strategy, 1)
                run_state, extra = run.load_checkpoint(ckpt, path)
                assert run_state["step"] == stage and extra["n"] == 1
                weights = full(run, moments=False)
                results[f"zero{stage}->{name} loaded"] = gap(
                    weights, {k: v[:1] for k, v in saved.items()}
                )
                step(run, 2)
                results[f"zero{stage}->{name} stepped"] = gap(full(run, moments=True), after)
            dropped = build(targets[f"zero{stage % 3 + 1}"], 1)  # another stage: resharded
            keep, zero_sink._flat_state = zero_sink._flat_state, lambda *a, **k: None
            try:
                dropped.load_checkpoint(ckpt, path)
            finally:
                zero_sink._flat_state = keep
            step(dropped, 2)
            results[f"zero{stage} without moments"] = gap(full(dropped, True), after)
            plain = CharTransformer(shape, data.tokenizer.vocab_size)
            adamw = torch.optim.AdamW(plain.parameters(), lr=1e-2, weight_decay=0.0)
            ckpt.load_resharded(plain, adamw, path)
            state = {n: adamw.state[p] for n, p in plain.named_parameters()}
            whole = {
                n: [p.detach(), *(state[n][k] for k in _KEYS)] for n, p in plain.named_parameters()
            }
            results[f"zero{stage}->plain loaded"] = gap(whole, saved)
            results[f"zero{stage}->plain step count"] = float(state["wte.weight"]["step"])
        return results
    finally:
        cleanup_distributed()


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    root = tmp_path_factory.mktemp("zero") / "checkpoints"
    return run_ranks(_reshard_worker, 2, args=(str(root),), timeout=280)[0]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_zero_checkpoint_fills_every_other_stage_and_a_plain_model(
    figures: dict[str, float], stage: int
) -> None:
    print({k: f"{v:.1e}" for k, v in figures.items() if k.startswith(f"zero{stage}")})
    for target in ("zero1", "zero2", "zero3", "zero2off", "zero3off", "zero3all"):
        loaded, stepped = (figures[f"zero{stage}->{target} {k}"] for k in ("loaded", "stepped"))
        assert loaded == 0.0, f"zero{stage} -> {target}: fp32 weights differ by {loaded:.1e}"
        if target == f"zero{stage}":  # DeepSpeed's own load: bitwise
            assert stepped == 0.0, f"zero{stage} on its own layout: {stepped:.1e}"
        else:
            assert stepped <= 1e-6, f"zero{stage} -> {target}, a step later: {stepped:.1e}"
    assert figures[f"zero{stage} layouts alike"] == 1.0, "only its own stage is laid out alike"
    dropped = figures[f"zero{stage} without moments"]
    assert dropped > 1e-4, f"without its moments the step still matched: {dropped:.1e}"
    assert figures[f"zero{stage}->plain loaded"] == 0.0
    assert figures[f"zero{stage}->plain step count"] == 2.0


@pytest.mark.parametrize(("stage", "kind"), [(1, "BF16_Optimizer"), (0, "DeepSpeedEngine")])
def test_an_engine_resharding_cannot_fill_is_refused_in_one_line(stage: int, kind: str) -> None:
    """DeepSpeed's BF16_Optimizer (``data_types.grad_accum_dtype: fp32`` at stage 1) and
    stage 0 keep their state in other places: refused by name, not an AttributeError."""
    from types import SimpleNamespace

    from gpu_training.checkpoint.files import CheckpointError
    from gpu_training.checkpoint.zero_sink import EngineSink

    optimizer = type(kind, (), {})()
    engine = SimpleNamespace(
        optimizer=optimizer,
        module=torch.nn.Linear(2, 2),
        zero_optimization_stage=lambda: stage,
    )
    expected = "runs BF16_Optimizer" if stage else "runs stage 0"
    with pytest.raises(CheckpointError, match=expected):
        EngineSink(engine)
