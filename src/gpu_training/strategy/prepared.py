"""Prepare and go: one call from a plain model to a model, optimizer and step functions.

The same loop body then serves every strategy::

    from gpu_training.strategy import prepare

    run = prepare(model, "fsdp", ctx, training_config)
    for micro_step, (x, y) in enumerate(loader):
        with run.steps.sync(micro_step):
            with run.steps.autocast():
                loss = loss_fn(run.model(x), y)
            run.steps.backward(loss)
        grad_norm = run.steps.step(micro_step)

The strategy also owns its checkpoint format, picked once by :func:`prepare`
(:attr:`Prepared.checkpoint_format`, a :class:`~gpu_training.checkpoint.CheckpointFormat`):
``run.save_checkpoint`` writes the model and optimizer the strategy's way (one ``state.pt``
from rank 0, DCP shards, DeepSpeed's files) beside the plain run state every format shares,
and ``run.load_checkpoint`` reads them back — or another strategy's, at any world size, where
the format can load it (every format loads every other's: ``CheckpointFormat.can_load``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpu_training.amp import MixedPrecisionStepper, resolve_precision
from gpu_training.checkpoint import CheckpointFormat, CheckpointManager, checkpoint_format
from gpu_training.config import TrainingConfig
from gpu_training.ddp import DistributedContext, resolve_device
from gpu_training.strategy.deepspeed import (
    build_deepspeed_config,
    deepspeed_initialize,
    deepspeed_step_fns,
)
from gpu_training.strategy.spec import StrategyConfig, StrategyError, parse_strategy
from gpu_training.strategy.wrap import (
    StepFns,
    apply_activation_checkpointing,
    detect_blocks,
    find_blocks,
    step_fns,
    wrap_model,
)

__all__ = ["OptimizerFactory", "Prepared", "default_optimizer", "prepare"]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
"""Builds the optimizer from the (wrapped, possibly sharded) model's parameters."""


def default_optimizer(config: TrainingConfig) -> OptimizerFactory:
    """AdamW at the config's scaled learning rate and weight decay."""

    def make(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            params, lr=config.scaled_learning_rate, weight_decay=config.weight_decay
        )

    return make


@dataclass
class Prepared:
    """What :func:`prepare` hands back."""

    model: nn.Module
    """Call this for forward: DDP, an FSDP2 module, the plain model, or a DeepSpeed engine."""

    optimizer: torch.optim.Optimizer
    """The torch optimizer holding the learning rate: attach LR schedulers here."""

    steps: StepFns
    """sync / autocast / backward / step for the micro-step loop."""

    strategy: StrategyConfig
    precision: str
    """The resolved precision (``fp32``, ``bf16`` or ``fp16``)."""

    checkpoint_format: CheckpointFormat
    """How :meth:`save_checkpoint` writes and :meth:`load_checkpoint` reads: the strategy's."""

    stepper: MixedPrecisionStepper | None = None
    """none/ddp/fsdp: the stepper (its state goes into checkpoints)."""

    engine: Any = None
    """deepspeed: the ``DeepSpeedEngine`` (the same object as ``model``)."""

    deepspeed_config: dict[str, Any] | None = None
    """deepspeed: the filled config it was initialised with."""

    @property
    def trainer(self) -> MixedPrecisionStepper | None:
        """The old name of :attr:`stepper` (read-only)."""
        return self.stepper

    def save_checkpoint(
        self,
        ckpt: CheckpointManager,
        run_state: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
    ) -> Path | None:
        """Saves the model and optimizer in this strategy's format, with the run state; every rank.

        Args:
            ckpt: Where to save.
            run_state: What :func:`~gpu_training.resume.capture_run_state` returned (its
                ``step`` is the checkpoint's).
            extra: Plain data of the caller's, given back by :meth:`load_checkpoint`.

        Returns:
            The checkpoint directory on rank 0, None on the other ranks.

        Raises:
            CheckpointError: On every rank if the save failed (nothing is pruned then).
        """
        return self.checkpoint_format.save(ckpt, self, run_state, extra)

    def load_checkpoint(
        self, ckpt: CheckpointManager, path: str | os.PathLike[str] | int
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Loads the model and optimizer in place from a checkpoint :meth:`save_checkpoint` wrote.

        Every rank calls it. A checkpoint of another format is read when this strategy's format
        can load it (resharded: a plain one into FSDP2 shards, a sharded one into whole
        tensors, anything to or from DeepSpeed per parameter). The run state comes back for
        :func:`~gpu_training.resume.restore_run_state`, the one place that puts it back
        whatever the format.

        Args:
            ckpt: Where to load from.
            path: The checkpoint directory or step.

        Returns:
            ``(run_state, extra)``: the run state saved, and the caller's extra.

        Raises:
            CheckpointError: If the checkpoint is missing, damaged, of a format this strategy
                cannot load, of another model or refused by the allow-lists.
        """
        return self.checkpoint_format.load(ckpt, self, path)


def _speed_up(
    model: nn.Module,
    spec: StrategyConfig,
    device: torch.device,
    precision: str,
    *,
    compile: bool,
    tf32: bool | None,
) -> None:
    """TF32 and ``torch.compile``, before wrapping."""
    if device.type == "cuda":
        allow = tf32 if tf32 is not None else precision in ("bf16", "fp16")
        torch.backends.cuda.matmul.allow_tf32 = allow
        torch.backends.cudnn.allow_tf32 = allow
    if not compile:
        return
    if spec.name == "fsdp":
        spec_blocks = spec.block_classes
        blocks = find_blocks(model, spec_blocks) if spec_blocks else detect_blocks(model)
        for _, block in blocks:  # one graph per FSDP unit, compiled in place
            block.compile()
    else:
        model.compile()  # in place: state_dict keys keep no "_orig_mod." prefix


def prepare(
    model: nn.Module,
    strategy: str | Mapping[str, Any] | StrategyConfig,
    ctx: DistributedContext,
    config: TrainingConfig,
    *,
    device: torch.device | str | None = None,
    optimizer: OptimizerFactory | None = None,
    deepspeed_config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    total_steps: int | None = None,
    compile: bool = False,
    tf32: bool | None = None,
) -> Prepared:
    """Wrap ``model`` for ``strategy``, build its optimizer and the step functions.

    none/ddp/fsdp: :func:`~gpu_training.strategy.wrap_model`, the optimizer over the wrapped
    parameters, a :class:`~gpu_training.amp.MixedPrecisionStepper` with the config's
    precision, accumulation and clipping. deepspeed:
    :func:`~gpu_training.strategy.build_deepspeed_config` (from ``deepspeed_config``, else
    the strategy's file, else the built-in ZeRO-2 config), activation checkpointing if asked,
    :func:`~gpu_training.strategy.deepspeed_initialize` with the torch optimizer unless the
    DeepSpeed config defines one.

    Args:
        model: The plain model.
        strategy: A name, a mapping of options or a :class:`StrategyConfig`.
        ctx: This process's context (after :func:`~gpu_training.ddp.init_distributed`).
        config: Batch, precision, learning rate and clipping.
        device: Where to train (default: :func:`~gpu_training.ddp.resolve_device`).
        optimizer: Optimizer factory (default: :func:`default_optimizer`).
        deepspeed_config: A DeepSpeed config (mapping or file) for ``deepspeed``.
        total_steps: Run length, for a DeepSpeed scheduler's ``"auto"`` total steps.
        compile: ``torch.compile`` the model in place before wrapping (under FSDP each
            block: one graph per FSDP unit).
        tf32: TF32 matmuls on a CUDA device (default: on for bf16/fp16, off for fp32).

    Returns:
        A :class:`Prepared` bundle.

    Raises:
        StrategyError: For invalid strategy options (see :func:`wrap_model`,
            :func:`build_deepspeed_config`), or fp16 with fsdp.
    """
    spec = parse_strategy(strategy)
    fmt = checkpoint_format(spec.checkpoint_format)  # the one place the name is looked up
    dev = torch.device(device) if device is not None else resolve_device(ctx)
    precision = resolve_precision(config.precision, dev)
    make_optimizer = optimizer if optimizer is not None else default_optimizer(config)
    _speed_up(model, spec, dev, precision, compile=compile, tf32=tf32)
    if spec.name == "deepspeed":
        ds_config = build_deepspeed_config(
            deepspeed_config if deepspeed_config is not None else spec.deepspeed_config,
            config,
            stage=spec.zero_stage,
            offload=spec.offload if spec.offload is not None else (spec.cpu_offload or None),
            precision=precision,
            total_steps=total_steps,
        )
        if spec.activation_checkpointing:
            blocks = (
                find_blocks(model, spec.block_classes)
                if spec.block_classes is not None
                else detect_blocks(model)
            )
            apply_activation_checkpointing(model, blocks)
        engine, _ = deepspeed_initialize(
            model,
            ds_config,
            ctx,
            optimizer=None if "optimizer" in ds_config else make_optimizer,
        )
        return Prepared(
            model=engine,
            optimizer=engine.basic_optimizer,
            steps=deepspeed_step_fns(engine),
            strategy=spec,
            precision=precision,
            checkpoint_format=fmt,
            engine=engine,
            deepspeed_config=ds_config,
        )
    if spec.name == "fsdp" and precision == "fp16":
        # GradScaler skips steps per rank; with sharded gradients the ranks would disagree.
        raise StrategyError(
            "fsdp with fp16 needs a loss scaler shared by all shards: use bf16 (or fp32)",
            "precision",
        )
    wrapped = wrap_model(model, spec, ctx, device=dev, mixed_precision=precision)
    from torch.distributed.fsdp import FSDPModule

    # FSDP's MixedPrecisionPolicy already computes in bf16: no autocast on top.
    amp_precision = "fp32" if isinstance(wrapped, FSDPModule) else precision
    stepper = MixedPrecisionStepper(
        make_optimizer(wrapped.parameters()),
        precision=amp_precision,
        grad_accum_steps=config.gradient_accumulation_steps,
        max_grad_norm=config.max_grad_norm,
        device=dev,
        max_nonfinite_steps=config.max_nonfinite_steps,
    )
    return Prepared(
        model=wrapped,
        optimizer=stepper.optimizer,
        steps=step_fns(wrapped, stepper),
        strategy=spec,
        precision=precision,
        checkpoint_format=fmt,
        stepper=stepper,
    )
