"""What a strategy is, as data: a name and its options, validated, with no torch import.

A config file's ``strategy:`` entry is either a bare name or a mapping::

    strategy: ddp

    strategy:
      name: fsdp
      block_classes: [Block]          # FSDP units / activation-checkpointed blocks
      activation_checkpointing: true
      sharding: full                  # or hybrid: replicate across nodes, shard within one
      tensor_parallel: 2              # 2-D: TP over 2 ranks, FSDP over the rest

:func:`parse_strategy` turns either form into a :class:`StrategyConfig`; a typo in a key or a
value is one :class:`StrategyError` line with a close-match suggestion.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_training.config import ConfigError, read_config_file

__all__ = [
    "DEEPSPEED_LAYOUT_KEYS",
    "OFFLOAD_MODES",
    "SHARDINGS",
    "STRATEGIES",
    "TP_STYLES",
    "StrategyConfig",
    "StrategyError",
    "deepspeed_math",
    "did_you_mean",
    "parse_strategy",
]

STRATEGIES: tuple[str, ...] = ("none", "ddp", "fsdp", "deepspeed")
"""Known strategy names: one process, replicate (DDP), shard (FSDP2), DeepSpeed ZeRO."""

SHARDINGS: tuple[str, ...] = ("full", "hybrid")
"""FSDP sharding: over every rank, or within a node and replicated across nodes (HSDP)."""

TP_STYLES: tuple[str, ...] = ("colwise", "rowwise", "sequence_parallel", "colwise_qkv")
"""How a tensor-parallel plan splits a module: its output features, its input features,
(a norm) the tokens of its input, each rank its share of the sequence, gathered after, or (a
packed ``[query | key | value]`` projection) each third's output features, so that every rank
keeps whole heads of all three."""

OFFLOAD_MODES: tuple[str, ...] = ("none", "optimizer", "all")
"""DeepSpeed CPU offload: nothing, optimizer state, or optimizer state and parameters."""


DEEPSPEED_LAYOUT_KEYS: frozenset[str] = frozenset(
    {
        "zero_optimization",  # stage, offload, buckets: where the state lives, not its math
        "train_batch_size",  # the batch and clipping: the training section's, checked
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "bf16",  # precision: training.precision decides it; loss-scale tuning only skips steps
        "fp16",
        "steps_per_print",
        "wall_clock_breakdown",
        "memory_breakdown",
        "dump_state",
        "flops_profiler",
        "tensorboard",
        "wandb",
        "csv_monitor",
        "comet",
        "comms_logger",
        "aio",
        "checkpoint",
        "activation_checkpointing",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
    }
)
"""Top-level keys of a DeepSpeed config that lay the run out, or that the training section
decides (batch, clipping, precision): none of them changes what a step computes beyond what
the job's other settings say. Every other key does, or may (``optimizer``, ``scheduler``,
``data_types``, ``communication_data_type``...)."""


def deepspeed_math(strategy: Mapping[str, Any]) -> dict[str, Any]:
    """What a strategy's DeepSpeed config file says about the run's math; ``{}`` for none.

    The file's keys beyond :data:`DEEPSPEED_LAYOUT_KEYS`, read where the strategy names it.
    Only ``deepspeed`` reads its file: any other strategy's math is ``{}``, as is DeepSpeed's
    built-in config's. A file that cannot be read is its path (what can be compared).

    Args:
        strategy: ``StrategyConfig.to_dict()``, or as a checkpoint's manifest recorded it.

    Example:
        >>> deepspeed_math({"name": "fsdp", "deepspeed_config": "ds.json"})
        {}
    """
    path = strategy.get("deepspeed_config")
    if strategy.get("name") != "deepspeed" or not path:
        return {}
    try:
        raw = read_config_file(str(path))
    except ConfigError:
        return {"deepspeed_config": str(path)}
    return {key: value for key, value in raw.items() if key not in DEEPSPEED_LAYOUT_KEYS}


class StrategyError(ConfigError):
    """A strategy, its options or the model it is applied to do not fit together.

    A :class:`~gpu_training.config.ConfigError` (so a ``ValueError``): the command line
    prints its one-line message and exits with code 2.
    """


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or an empty string.

    Example:
        >>> did_you_mean("fdsp", ["ddp", "fsdp"])
        " (did you mean 'fsdp'?)"
    """
    close = difflib.get_close_matches(value, list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise StrategyError(
            f"field 'strategy.{name}': expected true or false, got {value!r}", f"strategy.{name}"
        )


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        hint = did_you_mean(value, choices) if isinstance(value, str) else ""
        raise StrategyError(
            f"field 'strategy.{name}': expected one of {', '.join(choices)}, got {value!r}{hint}",
            f"strategy.{name}",
        )


def _check_tensor_parallel(spec: StrategyConfig) -> None:
    degree, plan = spec.tensor_parallel, spec.tp_plan
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise StrategyError(
            f"field 'strategy.tensor_parallel': expected a positive integer, got {degree!r}",
            "strategy.tensor_parallel",
        )
    if degree > 1 and spec.name != "fsdp":
        raise StrategyError(
            f"field 'strategy.tensor_parallel': tensor parallel runs under fsdp "
            f"(strategy: {{name: fsdp, tensor_parallel: {degree}}}), got strategy {spec.name!r}",
            "strategy.tensor_parallel",
        )
    if degree > 1 and spec.sharding != "full":
        raise StrategyError(
            "field 'strategy.tensor_parallel': a 2-D run shards over the data-parallel ranks "
            f"(sharding: full), got sharding {spec.sharding!r}",
            "strategy.tensor_parallel",
        )
    if plan is None or (isinstance(plan, str) and ":" in plan.strip(":")):
        return
    if not isinstance(plan, Mapping) or not plan:
        raise StrategyError(
            "field 'strategy.tp_plan': expected module-name patterns mapped to "
            f"{', '.join(TP_STYLES)}, or 'module:function', got {plan!r}",
            "strategy.tp_plan",
        )
    for pattern, style in plan.items():
        if not isinstance(pattern, str) or not pattern or style not in TP_STYLES:
            hint = did_you_mean(style, TP_STYLES) if isinstance(style, str) else ""
            raise StrategyError(
                f"field 'strategy.tp_plan': {pattern!r} maps to {style!r}; expected one of "
                f"{', '.join(TP_STYLES)}{hint}",
                "strategy.tp_plan",
            )


@dataclass(frozen=True)
class StrategyConfig:
    """How the model is spread over the ranks. Options of other strategies are ignored.

    Example:
        >>> StrategyConfig.from_dict({"name": "fsdp", "block_classes": "Block"}).block_classes
        ('Block',)

    Raises:
        StrategyError: On construction, for an unknown name or an out-of-range option.
    """

    name: str = "ddp"
    """``none`` (one process or plain model), ``ddp``, ``fsdp`` or ``deepspeed``."""

    block_classes: tuple[str, ...] | None = None
    """Class names of the repeated blocks (FSDP units, checkpointed blocks); None: detect them."""

    activation_checkpointing: bool = False
    """Recompute each block's activations in backward instead of storing them (none/ddp/fsdp)."""

    cpu_offload: bool = False
    """FSDP: keep sharded parameters, gradients and optimizer state in CPU memory. DeepSpeed
    (when ``offload`` is None): offload the optimizer state, and at stage 3 the parameters."""

    sharding: str = "full"
    """FSDP: ``full`` (shard over all ranks) or ``hybrid`` (shard within a node, replicate across)."""

    reshard_after_forward: bool = True
    """FSDP: free gathered parameters after forward (ZeRO-3); False keeps them (ZeRO-2-like)."""

    zero_stage: int | None = None
    """DeepSpeed: ZeRO stage 1 (optimizer state), 2 (+ gradients) or 3 (+ parameters);
    None: the DeepSpeed config's stage (2 in the built-in one)."""

    offload: str | None = None
    """DeepSpeed: CPU offload of ``none``, ``optimizer`` state, or ``all`` (stage 3: parameters
    too); None: as the DeepSpeed config says."""

    deepspeed_config: str | None = None
    """DeepSpeed: path of a JSON config whose ``"auto"`` values the toolkit fills in."""

    find_unused_parameters: bool = False
    """DDP: allow parameters that get no gradient in some steps (costs a graph walk per step)."""

    tensor_parallel: int = 1
    """FSDP: ranks that split each layer's matrices (tensor parallel, within a node); the
    world size is then ``tensor_parallel`` × the data-parallel (FSDP) size. 1: FSDP alone."""

    tp_plan: Mapping[str, str] | str | None = None
    """FSDP with ``tensor_parallel`` > 1: module-name patterns (``blocks.*.mlp.c_fc``) →
    ``colwise`` / ``rowwise`` / ``sequence_parallel`` / ``colwise_qkv``, or
    ``module:function`` called as ``function(model, tp_mesh)``; None: the model's own plan (``tp_plan`` of the built-in
    model, ``base_model_tp_plan`` of a Hugging Face one)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or self.name not in STRATEGIES:
            hint = did_you_mean(self.name, STRATEGIES) if isinstance(self.name, str) else ""
            raise StrategyError(
                f"unknown strategy {self.name!r}{hint}; expected one of {', '.join(STRATEGIES)}",
                "strategy.name",
            )
        blocks = self.block_classes
        if isinstance(blocks, str):
            blocks = (blocks,)
        if blocks is not None:
            if isinstance(blocks, Mapping) or not isinstance(blocks, Iterable):
                raise StrategyError(
                    f"field 'strategy.block_classes': expected a list of class names, got {blocks!r}",
                    "strategy.block_classes",
                )
            blocks = tuple(blocks)
            if not blocks or not all(isinstance(b, str) and b.strip() for b in blocks):
                raise StrategyError(
                    "field 'strategy.block_classes': expected a non-empty list of class names, "
                    f"got {list(blocks)!r}",
                    "strategy.block_classes",
                )
        object.__setattr__(self, "block_classes", blocks)
        for flag in (
            "activation_checkpointing",
            "cpu_offload",
            "reshard_after_forward",
            "find_unused_parameters",
        ):
            _check_bool(flag, getattr(self, flag))
        _check_choice("sharding", self.sharding, SHARDINGS)
        if self.offload is not None:
            _check_choice("offload", self.offload, OFFLOAD_MODES)
        stage = self.zero_stage
        if stage is not None and (
            isinstance(stage, bool) or not isinstance(stage, int) or stage not in (1, 2, 3)
        ):
            raise StrategyError(
                f"field 'strategy.zero_stage': expected 1, 2 or 3, got {stage!r}",
                "strategy.zero_stage",
            )
        if self.offload == "all" and stage is not None and stage != 3:
            raise StrategyError(
                f"field 'strategy.offload': 'all' offloads parameters, which needs zero_stage 3, "
                f"got zero_stage {stage}",
                "strategy.offload",
            )
        if self.deepspeed_config is not None and not (
            isinstance(self.deepspeed_config, str) and self.deepspeed_config
        ):
            raise StrategyError(
                "field 'strategy.deepspeed_config': expected a path to a JSON file, "
                f"got {self.deepspeed_config!r}",
                "strategy.deepspeed_config",
            )

        _check_tensor_parallel(self)

    @property
    def checkpoint_format(self) -> str:
        """The checkpoint format this strategy saves and resumes (a manifest's ``state_format``).

        ``"dcp"`` for FSDP (sharded), ``"deepspeed"`` for DeepSpeed's own files, ``"torch"``
        (one full ``state.pt`` written by rank 0) otherwise.
        """
        return {"fsdp": "dcp", "deepspeed": "deepspeed"}.get(self.name, "torch")

    def to_dict(self) -> dict[str, Any]:
        """The options as plain data (round-trips through :meth:`from_dict`)."""
        data = dataclasses.asdict(self)
        if isinstance(self.tp_plan, Mapping):
            data["tp_plan"] = dict(self.tp_plan)
        if self.block_classes is not None:
            data["block_classes"] = list(self.block_classes)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> StrategyConfig:
        """Build from a mapping, rejecting unknown keys with a close-match hint.

        Args:
            data: Option names to values (``name`` defaults to ``ddp``).
            source: A file name to prefix error messages with.

        Raises:
            StrategyError: For an unknown key or an invalid value.
        """
        prefix = f"{source}: " if source else ""
        if not isinstance(data, Mapping):
            raise StrategyError(
                f"{prefix}field 'strategy': expected a name or a mapping of options, "
                f"got {type(data).__name__}",
                "strategy",
            )
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                raise StrategyError(
                    f"{prefix}unknown field 'strategy.{key}'{did_you_mean(str(key), names)}",
                    f"strategy.{key}",
                )
        try:
            return cls(**dict(data))
        except StrategyError as err:
            raise StrategyError(f"{prefix}{err}", err.field) from None


def parse_strategy(
    value: str | Mapping[str, Any] | StrategyConfig | Any | None, *, source: str | None = None
) -> StrategyConfig:
    """A :class:`StrategyConfig` from a name, a mapping or dataclass of options, or None (``ddp``).

    Example:
        >>> parse_strategy("fsdp").name
        'fsdp'

    Raises:
        StrategyError: For an unknown name, key or value.
    """
    if value is None:
        return StrategyConfig()
    if isinstance(value, StrategyConfig):
        return value
    if isinstance(value, str):
        return StrategyConfig.from_dict({"name": value}, source=source)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # another spec with the same field names (e.g. a job file's strategy section)
        return StrategyConfig.from_dict(dataclasses.asdict(value), source=source)
    if not isinstance(value, Mapping):
        raise StrategyError(
            f"field 'strategy': expected a name or a mapping of options, got {value!r}",
            "strategy",
        )
    return StrategyConfig.from_dict(value, source=source)
