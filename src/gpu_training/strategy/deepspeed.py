"""DeepSpeed ZeRO 1-3 and CPU offload, configured from a TrainingConfig (``deepspeed`` extra).

DeepSpeed configs in the wild carry ``"auto"`` placeholders that Hugging Face's Trainer and
Accelerate fill in; handed to ``deepspeed.initialize`` as they are, they crash it. Here the
batch arithmetic, clipping, precision and learning rate come from the one
:class:`~gpu_training.config.TrainingConfig`, so the two can never disagree::

    from gpu_training.strategy import build_deepspeed_config, deepspeed_initialize

    ds_config = build_deepspeed_config("configs/deepspeed_config.json", cfg, stage=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.scaled_learning_rate)
    engine, ds_optimizer = deepspeed_initialize(model, ds_config, ctx, optimizer=optimizer)
    loss = loss_fn(engine(x), y)
    engine.backward(loss)          # divides by the accumulation steps itself
    engine.step()                  # steps only on accumulation boundaries

Passing a torch optimizer (rather than an ``"optimizer"`` section) needs no C++ op build: on
a CPU-only host DeepSpeed JIT-compiles ``FusedAdam`` for a config-defined AdamW (minutes).
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gpu_training.amp import GradNorm, resolve_precision
from gpu_training.config import ConfigError, TrainingConfig, read_config_file
from gpu_training.ddp import DistributedContext
from gpu_training.process_group import destroy_with_group
from gpu_training.strategy.spec import OFFLOAD_MODES, StrategyError, did_you_mean
from gpu_training.strategy.wrap import StepFns

__all__ = [
    "DEFAULT_DEEPSPEED_CONFIG",
    "build_deepspeed_config",
    "deepspeed_initialize",
    "deepspeed_step_fns",
    "find_auto_values",
]

DEFAULT_DEEPSPEED_CONFIG: dict[str, Any] = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
    "fp16": {"enabled": "auto"},
    "zero_optimization": {
        "stage": 2,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
    },
    "steps_per_print": 1000,
    "wall_clock_breakdown": False,
}
"""The built-in config (ZeRO-2, every batch/precision value filled from the TrainingConfig)."""

_ADAMW_BETAS = [0.9, 0.999]  # torch.optim.AdamW's defaults: what "auto" betas/eps mean here
_ADAMW_EPS = 1e-8

# Sizes derived from the model's hidden size when one is given (Hugging Face's formulas);
# without one, "auto" means DeepSpeed's own default and the key is dropped.
_ZERO_SIZE_KEYS: dict[str, Callable[[int], int]] = {
    "reduce_bucket_size": lambda h: h * h,
    "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    "stage3_param_persistence_threshold": lambda h: 10 * h,
}
_ZERO_DEFAULT_KEYS = (
    "allgather_bucket_size",
    "sub_group_size",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save",
)


def find_auto_values(config: Any, path: str = "") -> list[str]:
    """Dotted key paths of every ``"auto"`` value left in a (nested) DeepSpeed config.

    Example:
        >>> find_auto_values({"a": 1, "zero_optimization": {"stage": "auto"}})
        ['zero_optimization.stage']
    """
    if isinstance(config, str):
        return [path] if config == "auto" else []
    found: list[str] = []
    if isinstance(config, Mapping):
        for key, value in config.items():
            found += find_auto_values(value, f"{path}.{key}" if path else str(key))
    elif isinstance(config, list):
        for i, value in enumerate(config):
            found += find_auto_values(value, f"{path}[{i}]")
    return found


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return bool(a == b)


class _Filler:
    """Fills ``"auto"``/missing keys of one config and reports explicit values that disagree."""

    def __init__(self, config: dict[str, Any], source: str) -> None:
        self.config = config
        self.source = source

    def section(self, path: str) -> dict[str, Any]:
        node: Any = self.config
        for key in path.split("."):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                raise StrategyError(
                    f"{self.source}: '{path}' must be a mapping, got {child!r}", path
                )
            node = child
        return node

    def fill(self, path: str, value: Any, reason: str, *, add: bool = True) -> None:
        """Set ``path`` to ``value`` if it is "auto" (or missing and ``add``); else compare."""
        parent_path, _, key = path.rpartition(".")
        node = self.section(parent_path) if parent_path else self.config
        current = node.get(key, "auto" if add else None)
        if current == "auto":
            node[key] = value
        elif current is not None and not _same(current, value):
            raise StrategyError(
                f"{self.source}: '{path}' is {current!r} but {reason} gives {value!r}: "
                'set it to "auto" or make the two agree',
                path,
            )


def _load_base(
    base: Mapping[str, Any] | str | os.PathLike[str] | None,
) -> tuple[dict[str, Any], str]:
    if base is None:
        return copy.deepcopy(DEFAULT_DEEPSPEED_CONFIG), "built-in DeepSpeed config"
    if isinstance(base, Mapping):
        return copy.deepcopy(dict(base)), "DeepSpeed config"
    try:
        return read_config_file(base), str(base)
    except ConfigError as err:
        raise StrategyError(str(err), "strategy.deepspeed_config") from None


def _offload_mode(offload: str | bool | None, stage: int) -> str | None:
    if offload is None:
        return None
    if isinstance(offload, bool):  # True: everything the stage can offload
        return ("all" if stage == 3 else "optimizer") if offload else "none"
    if offload not in OFFLOAD_MODES:
        raise StrategyError(
            f"offload must be one of {', '.join(OFFLOAD_MODES)}, got {offload!r}"
            f"{did_you_mean(str(offload), OFFLOAD_MODES)}",
            "strategy.offload",
        )
    return offload


def _fill_offload(f: _Filler, zero: dict[str, Any], mode: str | None, stage: int) -> bool:
    """Set the offload sections for ``mode`` (None: keep the file's); True if the optimizer is."""
    pin = torch.cuda.is_available()  # pinned host memory needs a GPU
    for key, on in (
        ("offload_optimizer", mode in ("optimizer", "all")),
        ("offload_param", mode == "all"),
    ):
        section = zero.get(key)
        if section is not None and not isinstance(section, dict):
            raise StrategyError(
                f"{f.source}: 'zero_optimization.{key}' must be a mapping, got {section!r}",
                f"zero_optimization.{key}",
            )
        if mode is not None:
            if on:
                section = zero[key] = {**(section or {}), "device": "cpu"}
            elif section is not None:
                section["device"] = "none"
        if section is None:
            continue
        if section.get("device") == "auto":
            section["device"] = "none"
        if section.get("pin_memory", "auto") == "auto":
            section["pin_memory"] = pin
    devices = {
        k: (zero.get(k) or {}).get("device", "none") for k in ("offload_optimizer", "offload_param")
    }
    if devices["offload_param"] != "none" and stage != 3:
        raise StrategyError(
            f"{f.source}: parameter offload (zero_optimization.offload_param) needs ZeRO stage 3, "
            f"got stage {stage}",
            "zero_optimization.offload_param",
        )
    return devices["offload_optimizer"] != "none"


def _fill_scheduler(f: _Filler, cfg: TrainingConfig, lr: float, total_steps: int | None) -> None:
    scheduler = f.config.get("scheduler")
    if scheduler is None:
        return
    if not isinstance(scheduler, dict):
        raise StrategyError(f"{f.source}: 'scheduler' must be a mapping", "scheduler")
    params = f.section("scheduler.params")
    steps = total_steps if total_steps is not None else cfg.max_steps
    values: dict[str, Any] = {
        "warmup_min_lr": 0.0,
        "warmup_max_lr": lr,
        "warmup_num_steps": cfg.warmup_steps,
        "warmup_type": "linear",
        "warmup_min_ratio": 0.0,
        "cos_min_ratio": cfg.min_lr_ratio,
    }
    for key, value in params.items():
        if value != "auto":
            continue
        if key == "total_num_steps":
            if steps is None:
                raise StrategyError(
                    f"{f.source}: 'scheduler.params.total_num_steps' is \"auto\" but the run's "
                    "length is unknown: set max_steps or pass total_steps",
                    "scheduler.params.total_num_steps",
                )
            params[key] = steps
        elif key in values:
            params[key] = values[key]


def build_deepspeed_config(
    base: Mapping[str, Any] | str | os.PathLike[str] | None,
    training_config: TrainingConfig,
    *,
    stage: int | None = None,
    offload: str | bool | None = None,
    precision: str | None = None,
    total_steps: int | None = None,
    hidden_size: int | None = None,
    cpu_adam: bool | None = None,
) -> dict[str, Any]:
    """A complete DeepSpeed config: every ``"auto"`` filled from ``training_config``.

    Filled (when ``"auto"`` or absent): ``train_batch_size`` (the effective batch),
    ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``,
    ``gradient_clipping`` (``max_grad_norm``; 0 disables), ``bf16``/``fp16.enabled`` (the
    precision); when the sections exist, the optimizer's ``lr`` (the scaled learning rate),
    ``weight_decay``, ``betas`` and ``eps`` (AdamW's defaults), and the scheduler's
    warmup/decay values. Bucket sizes come from ``hidden_size`` (or DeepSpeed's defaults).
    An explicit value that disagrees with the training config is an error, as is any
    ``"auto"`` not listed here. ``stage`` and ``offload``, when given, override the file:
    the strategy picks them, the file is a template.

    CPU offload of the optimizer: when ``cpu_adam`` (default: a GPU is present) and the
    config defines no optimizer, an ``AdamW`` section is added, which DeepSpeed runs as
    ``DeepSpeedCPUAdam`` (a C++ op, slow to build the first time). Otherwise the caller's
    torch optimizer runs on the offloaded state and ``zero_force_ds_cpu_optimizer`` is
    switched off (DeepSpeed refuses a client optimizer with offload unless told).

    Args:
        base: A config mapping, a JSON/YAML file, or None for :data:`DEFAULT_DEEPSPEED_CONFIG`.
        training_config: Source of the batch, clipping, precision and learning rate.
        stage: ZeRO stage 0-3 (None: the config's; ``"auto"`` or absent means 2).
        offload: ``"none"`` (or False), ``"optimizer"``, ``"all"`` (stage 3), or True for
            what the stage allows (optimizer; at stage 3 parameters too); None: as the config
            says.
        precision: Overrides ``training_config.precision``; ``"auto"`` is resolved for this
            machine (fp32 on the CPU).
        total_steps: Run length for a scheduler's ``total_num_steps`` (default ``max_steps``).
        hidden_size: The model's hidden size, for ``"auto"`` bucket sizes.
        cpu_adam: Use DeepSpeed's CPU Adam for an offloaded optimizer (see above).

    Returns:
        A new dict, safe to pass to ``deepspeed.initialize``.

    Raises:
        StrategyError: For an unreadable file, an unknown ``"auto"`` (named by its key
            path), a value that contradicts the training config, or an invalid stage/offload.

    Example:
        >>> cfg = TrainingConfig(per_device_batch_size=4, gradient_accumulation_steps=2,
        ...                      world_size=2, precision="fp32")
        >>> ds = build_deepspeed_config(None, cfg, stage=3)
        >>> ds["train_batch_size"], ds["zero_optimization"]["stage"], ds["bf16"]["enabled"]
        (16, 3, False)
    """
    config, source = _load_base(base)
    f = _Filler(config, source)
    tc = training_config
    lr = tc.scaled_learning_rate
    f.fill("train_micro_batch_size_per_gpu", tc.per_device_batch_size, "per_device_batch_size")
    f.fill(
        "gradient_accumulation_steps", tc.gradient_accumulation_steps, "gradient_accumulation_steps"
    )
    f.fill("train_batch_size", tc.effective_batch_size, "the effective batch size")
    clip = float(tc.max_grad_norm) if tc.max_grad_norm is not None else 0.0
    f.fill("gradient_clipping", clip, "max_grad_norm")

    resolved = resolve_precision(precision if precision is not None else tc.precision)
    for key in ("bf16", "fp16"):
        enabled = resolved == key
        if key in config or enabled:
            section = f.section(key)
            if "enabled" not in section and key in config:
                section["enabled"] = "auto"  # no "enabled": fill it like "auto"
            f.fill(f"{key}.enabled", enabled, f"precision {resolved!r}")

    zero = f.section("zero_optimization")
    if stage is not None and (isinstance(stage, bool) or stage not in (0, 1, 2, 3)):
        raise StrategyError(f"stage must be 0, 1, 2 or 3, got {stage!r}", "strategy.zero_stage")
    if stage is not None:  # the strategy picks the stage; the file is a template
        zero["stage"] = stage
    elif zero.get("stage", "auto") == "auto":
        zero["stage"] = 2
    final_stage = zero["stage"]
    if isinstance(final_stage, bool) or final_stage not in (0, 1, 2, 3):
        raise StrategyError(
            f"{source}: 'zero_optimization.stage' must be 0-3, got {final_stage!r}",
            "zero_optimization.stage",
        )
    for key, size in _ZERO_SIZE_KEYS.items():
        if zero.get(key) == "auto":
            if hidden_size is not None:
                zero[key] = size(hidden_size)
            else:
                del zero[key]
    for key in _ZERO_DEFAULT_KEYS:
        if zero.get(key) == "auto":
            del zero[key]
    offloaded = _fill_offload(f, zero, _offload_mode(offload, final_stage), final_stage)
    if offloaded and final_stage == 0:
        raise StrategyError(f"{source}: CPU offload needs ZeRO stage 1-3", "zero_optimization")

    if offloaded and "optimizer" not in config:
        if cpu_adam if cpu_adam is not None else torch.cuda.is_available():
            config["optimizer"] = {"type": "AdamW", "params": {}}
        else:
            config["zero_force_ds_cpu_optimizer"] = False
    if "optimizer" in config:
        f.fill("optimizer.params.lr", lr, "the (scaled) learning rate")
        f.fill("optimizer.params.weight_decay", float(tc.weight_decay), "weight_decay")
        params = f.section("optimizer.params")
        for key, default in (("betas", list(_ADAMW_BETAS)), ("eps", _ADAMW_EPS)):
            if params.get(key, "auto") == "auto":  # an explicit choice is the user's to make
                params[key] = default
    _fill_scheduler(f, tc, lr, total_steps)

    left = find_auto_values(config)
    if left:
        raise StrategyError(
            f"{source}: cannot fill \"auto\" at '{left[0]}' (the toolkit fills batch sizes, "
            "clipping, precision, ZeRO stage and bucket sizes, optimizer and scheduler values)"
            + (f"; also at {', '.join(repr(p) for p in left[1:])}" if left[1:] else ""),
            left[0],
        )
    return config


# --- initialisation -------------------------------------------------------------------------


def _import_deepspeed() -> Any:
    if not torch.cuda.is_available():
        # Without it DeepSpeed probes for accelerators and warns; the CPU is what we have.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except ImportError as err:
        raise ModuleNotFoundError(
            f"strategy 'deepspeed' needs DeepSpeed: pip install 'gpu-training[deepspeed]' ({err})"
        ) from err
    return deepspeed


@contextlib.contextmanager
def _without_cpu_shm_op(skip: bool) -> Iterator[None]:
    """Stop DeepSpeed from JIT-building its shared-memory comm op while it sets up.

    That op (slow to compile on first use) serves only DeepSpeed's inference
    all-reduce on CPU; training collectives go through torch.distributed either way.
    """
    module = sys.modules.get("deepspeed.comm.torch")
    original = getattr(module, "build_shm_op", None)
    if not skip or module is None or original is None:
        yield
        return
    module.build_shm_op = lambda: None  # type: ignore[attr-defined]
    try:
        yield
    finally:
        module.build_shm_op = original  # type: ignore[attr-defined]


@contextlib.contextmanager
def _fp16_on_any_cpu(active: bool) -> Iterator[None]:
    """Let DeepSpeed's engine start in fp16 on a CPU whose oneDNN has no native fp16 kernels.

    DeepSpeed's CPU accelerator reports fp16 only where oneDNN has native fp16 (AVX512-FP16 or
    AMX-FP16: recent Intel server parts) and its engine then refuses an fp16 config ("Type fp16
    is not supported on your device"), while it reports bf16 everywhere. Torch computes fp16 on
    any x86 CPU (converting on the fly: slower, the same numbers). A CPU run is a check of a
    GPU job, and whether it starts must not depend on the CPU model the machine drew: the
    engine's start-up check sees fp16 as supported; nothing else is changed, and a GPU's
    accelerator is never touched.
    """
    if not active:
        yield
        return
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu" or accelerator.is_fp16_supported():
        yield
        return
    accelerator.is_fp16_supported = lambda: True  # this instance only, for initialize()
    try:
        yield
    finally:
        del accelerator.is_fp16_supported  # the class's method again


def _ensure_process_group(ctx: DistributedContext) -> None:
    if dist.is_initialized():
        return
    if ctx.is_distributed:
        raise RuntimeError(
            f"DeepSpeed on {ctx.world_size} ranks needs the process group: call "
            "gpu_training.ddp.init_distributed() first"
        )
    # One process (a notebook): a private in-memory store instead of a rendezvous or MPI, and
    # the one launcher variable DeepSpeed's engine insists on reading.
    os.environ.setdefault("LOCAL_RANK", "0")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    from torch._C._distributed_c10d import HashStore

    dist.init_process_group(backend, store=HashStore(), rank=0, world_size=1)


def _check_zero_optimizer(
    optimizer: torch.optim.Optimizer | None, config: Mapping[str, Any]
) -> None:
    """DeepSpeed's "untested optimizer" assertion, as a one-line error that says what to do."""
    stage = (config.get("zero_optimization") or {}).get("stage", 0)
    if optimizer is None or not stage or config.get("zero_allow_untested_optimizer"):
        return
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    if type(optimizer) not in ZERO_SUPPORTED_OPTIMIZERS:
        raise StrategyError(
            f"DeepSpeed ZeRO is not tested with {type(optimizer).__name__}: use AdamW/Adam/"
            'Adagrad, or set "zero_allow_untested_optimizer": true in the DeepSpeed config',
            "zero_allow_untested_optimizer",
        )


def deepspeed_initialize(
    model: nn.Module,
    config: Mapping[str, Any],
    ctx: DistributedContext | None = None,
    *,
    optimizer: torch.optim.Optimizer
    | Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
    | None = None,
    lr_scheduler: Any = None,
    build_cpu_comm_op: bool = False,
) -> tuple[Any, Any]:
    """``deepspeed.initialize`` on an already-joined process group, with a checked config.

    Works after :func:`~gpu_training.ddp.init_distributed` (DeepSpeed then reuses the group;
    gloo on CPU, nccl on GPUs) and in one process without a launcher (a private one-rank
    group is created, which :func:`~gpu_training.ddp.cleanup_distributed` destroys, and
    ``LOCAL_RANK=0`` is set if unset). On a CPU-only host
    DeepSpeed's inference-only shared-memory op is not built unless ``build_cpu_comm_op``,
    and an fp16 config starts whatever the CPU model (DeepSpeed's CPU accelerator refuses fp16
    where oneDNN lacks native fp16 kernels; torch computes it on any CPU).

    Args:
        model: The plain model (DeepSpeed moves and, for stage 3, partitions it).
        config: A filled config from :func:`build_deepspeed_config`.
        ctx: This process's context (default: read from the environment).
        optimizer: A torch optimizer over ``model``'s parameters or a factory taking the
            parameters; must be None when the config has an ``"optimizer"`` section. A torch
            optimizer needs no C++ op build.
        lr_scheduler: Passed to DeepSpeed, which steps it on every optimizer step. To drive
            the LR yourself instead, attach a torch scheduler to ``engine.basic_optimizer``.
        build_cpu_comm_op: Let DeepSpeed build its CPU shared-memory comm op.

    Returns:
        ``(engine, optimizer)``: call ``engine(x)``, ``engine.backward(loss)``,
        ``engine.step()``; the optimizer is DeepSpeed's (ZeRO) wrapper.

    Raises:
        StrategyError: If ``"auto"`` values are left, the batch sizes do not match this
            world size, the optimizer is given twice or not at all, or ZeRO is asked to run
            an optimizer DeepSpeed has not tested (without ``zero_allow_untested_optimizer``).
        ModuleNotFoundError: Without the ``deepspeed`` extra.
        RuntimeError: When ``ctx`` is distributed but no process group was initialised.
    """
    ctx = DistributedContext.from_env() if ctx is None else ctx
    left = find_auto_values(config)
    if left:
        raise StrategyError(
            f'DeepSpeed config still has "auto" at {", ".join(repr(p) for p in left)}: '
            "fill it with build_deepspeed_config",
            left[0],
        )
    micro = config.get("train_micro_batch_size_per_gpu")
    accum = config.get("gradient_accumulation_steps")
    total = config.get("train_batch_size")
    if not all(isinstance(v, int) for v in (micro, accum, total)):
        raise StrategyError(
            "DeepSpeed config needs integer train_batch_size, train_micro_batch_size_per_gpu "
            "and gradient_accumulation_steps (build it with build_deepspeed_config)",
            "train_batch_size",
        )
    if micro * accum * ctx.world_size != total:  # type: ignore[operator]
        raise StrategyError(
            f"DeepSpeed config: train_batch_size {total} != {micro} per GPU x {accum} "
            f"accumulation x {ctx.world_size} ranks: build it with world_size={ctx.world_size}",
            "train_batch_size",
        )
    in_config = "optimizer" in config
    if in_config and optimizer is not None:
        raise StrategyError(
            "the DeepSpeed config defines an optimizer and one was passed too: keep one",
            "optimizer",
        )
    if not in_config and optimizer is None:
        raise StrategyError(
            "no optimizer: pass optimizer= (a torch optimizer or a factory) or define one in "
            "the DeepSpeed config",
            "optimizer",
        )
    deepspeed = _import_deepspeed()
    _ensure_process_group(ctx)
    client = optimizer
    if client is not None and not isinstance(client, torch.optim.Optimizer):
        client = client(model.parameters())
    _check_zero_optimizer(client, config)
    cpu = not torch.cuda.is_available()
    fp16 = cpu and (config.get("fp16") or {}).get("enabled") is True
    with _without_cpu_shm_op(skip=cpu and not build_cpu_comm_op), _fp16_on_any_cpu(fp16):
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            model=model,
            optimizer=client,
            model_parameters=model.parameters() if in_config else None,
            lr_scheduler=lr_scheduler,
            config=dict(config),
        )
    destroy_with_group(engine)  # its hooks' cycle would keep the groups alive at exit
    return engine, ds_optimizer


def deepspeed_step_fns(engine: Any) -> StepFns:
    """:class:`~gpu_training.strategy.StepFns` driving a DeepSpeed engine.

    DeepSpeed keeps its own micro-step count, reduces gradients when it needs to, divides
    the loss by the accumulation steps in ``backward`` and steps only on boundaries; the
    ``micro_step`` arguments are there for the uniform loop and must follow the same count.
    """

    def sync(micro_step: int) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def autocast() -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # DeepSpeed casts the model itself (bf16/fp16 sections)

    def backward(loss: torch.Tensor) -> None:
        engine.backward(loss)

    def step(micro_step: int) -> float | None:
        boundary = bool(engine.is_gradient_accumulation_boundary())
        engine.step()
        if not boundary:
            return None
        norm = engine.get_global_grad_norm()
        return float(norm) if norm is not None else math.nan

    def step_async(micro_step: int) -> GradNorm | None:
        norm = step(micro_step)  # DeepSpeed has synchronised to compute it already
        return None if norm is None else GradNorm(torch.tensor(norm, dtype=torch.float64))

    return StepFns(
        sync=sync, autocast=autocast, backward=backward, step=step, step_async=step_async
    )
