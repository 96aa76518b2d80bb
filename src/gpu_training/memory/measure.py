"""Measuring what a training step holds: saved-for-backward bytes and the live-tensor peak.

Two instruments, both working on real tensors and on *fake* ones (metadata only, no storage,
no arithmetic: ``torch._subclasses.FakeTensorMode``, the machinery ``torch.compile`` traces
with), so a 7B model's step is "run" on a laptop in well under a second:

- :func:`torch.autograd.graph.saved_tensors_hooks` sees every tensor autograd keeps for
  backward; the unique storages among them, parameters and buffers excluded, are the
  activations.
- :class:`~gpu_training.memory.live_tensors.LiveTensorTracker`, a ``TorchDispatchMode``, sees
  every tensor an operator creates and when its storage dies, so it knows the live bytes after
  every operator: the peak of a forward + backward, and of an optimizer step (it and
  :func:`~gpu_training.memory.live_tensors.storage_key` are re-exported here).

:func:`profile_step` runs one training step (forward under autocast, backward, clipping,
optimizer step) on fake copies of a model's parameters and reports both, with the saved bytes
attributed to the model's repeated blocks so activation checkpointing can be priced too.

Example:
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    >>> make_batch = lambda n: (torch.randn(n, 64), torch.randint(10, (n,)))
    >>> fake = profile_step(model, make_batch, 32, loss_fn=nn.functional.cross_entropy)
    >>> fake.saved == measure_activation_bytes(model, make_batch(32), nn.functional.cross_entropy)
    True
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from gpu_training.memory.live_tensors import LiveTensorTracker, storage_bytes, storage_key

__all__ = [
    "LiveTensorTracker",
    "StepSample",
    "build_optimizer",
    "detect_blocks",
    "measure_activation_bytes",
    "profile_step",
    "repeated_blocks",
    "storage_key",
]

LossFn = Callable[[Any, Any], torch.Tensor]
BatchFactory = Callable[[int], Sequence[Any]]


# --- storages ------------------------------------------------------------------------------


def _unique_bytes(tensors: Iterator[torch.Tensor] | Sequence[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        key = storage_key(t)
        if key is not None and key not in seen:
            seen[key] = storage_bytes(t)
    return sum(seen.values())


def _state_keys(model: nn.Module) -> set[int]:
    keys = {storage_key(t) for t in (*model.parameters(), *model.buffers())}
    return {k for k in keys if k is not None}


# --- blocks --------------------------------------------------------------------------------


def _param_count(modules: Iterable[nn.Module]) -> int:
    """Elements of the parameters of ``modules``, each parameter counted once (tied ones too)."""
    seen: set[int] = set()
    total = 0
    for module in modules:
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return total


def repeated_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's repeated blocks, as ``(qualified name, module)`` pairs; ``[]`` when none.

    The one scan both :func:`detect_blocks` and ``gpu_training.strategy.detect_blocks`` use:
    among every ``nn.ModuleList`` and ``nn.Sequential``, the children of one class that have
    parameters, two or more of them; the group covering the most parameters wins (a
    transformer's layer stack, not the two linears of each layer's MLP), each parameter
    counted once (tied weights too), the first such group on a tie.

    Example:
        >>> m = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 8), nn.Linear(8, 2))
        >>> [name for name, _ in repeated_blocks(m)]
        ['0', '2', '3']
    """
    best: list[tuple[str, nn.Module]] = []
    best_size = -1
    for prefix, container in model.named_modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        groups: dict[type, list[tuple[str, nn.Module]]] = {}
        for child_name, child in container.named_children():
            if any(True for _ in child.parameters()):
                name = f"{prefix}.{child_name}" if prefix else child_name
                groups.setdefault(type(child), []).append((name, child))
        for members in groups.values():
            size = _param_count(m for _, m in members)
            if len(members) >= 2 and size > best_size:
                best, best_size = members, size
    return best


def detect_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks (:func:`repeated_blocks`), the modules only; ``[]`` if none.

    ``gpu_training.strategy.detect_blocks``, which sits above this module, takes a Hugging
    Face model's declared blocks first, then runs the same scan, and raises instead of
    returning ``[]``.

    Example:
        >>> m = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 8))
        >>> [type(b).__name__ for b in detect_blocks(m)]
        ['Linear', 'Linear']
    """
    return [module for _, module in repeated_blocks(model)]


# --- fake copies of a model's state ----------------------------------------------------------


@contextlib.contextmanager
def _swapped_state(
    model: nn.Module, convert: Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[None]:
    """Temporarily replace every parameter and buffer by ``convert(tensor)`` (tied stay tied)."""
    memo: dict[int, torch.Tensor] = {}
    saved: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    try:
        for module in model.modules():
            for name, param in list(module._parameters.items()):
                if param is None:
                    continue
                if id(param) not in memo:
                    memo[id(param)] = nn.Parameter(
                        convert(param.detach()), requires_grad=param.requires_grad
                    )
                saved.append((module._parameters, name, param))
                module._parameters[name] = memo[id(param)]  # type: ignore[assignment]
            for name, buf in list(module._buffers.items()):
                if buf is None:
                    continue
                if id(buf) not in memo:
                    memo[id(buf)] = convert(buf)
                saved.append((module._buffers, name, buf))
                module._buffers[name] = memo[id(buf)]
        yield
    finally:
        for table, name, original in saved:
            table[name] = original


@contextlib.contextmanager
def _checkpointed(blocks: Sequence[nn.Module]) -> Iterator[None]:
    """Run each block under non-reentrant ``torch.utils.checkpoint`` (recomputed in backward)."""
    from torch.utils.checkpoint import checkpoint

    originals = [block.forward for block in blocks]
    try:
        for block, forward in zip(blocks, originals, strict=True):
            # preserve_rng_state=False: the fake step needs no bitwise-equal dropout masks.
            block.forward = functools.partial(
                checkpoint, forward, use_reentrant=False, preserve_rng_state=False
            )
        yield
    finally:
        for block, forward in zip(blocks, originals, strict=True):
            block.forward = forward


# --- optimizer -----------------------------------------------------------------------------


def build_optimizer(
    name: str,
    params: Sequence[torch.Tensor],
    *,
    foreach: bool | None = None,
    fused: bool = False,
) -> torch.optim.Optimizer:
    """The torch optimizer a name from :data:`~gpu_training.memory.OPTIMIZER_STATE_BYTES` means.

    ``foreach=True`` is what torch picks on CUDA: one batched update over all parameters,
    which allocates scratch the size of all of them at once; the CPU default loops.
    ``fused=True`` (the Trainer's AdamW on CUDA) updates in place: no such scratch.

    Raises:
        ValueError: For an unknown name.
    """
    key = name.lower()
    if key in ("adamw", "adam"):
        cls = torch.optim.AdamW if key == "adamw" else torch.optim.Adam
        return cls(params, lr=1e-3, foreach=foreach, fused=fused or None)
    if key in ("sgd", "sgd_momentum"):
        momentum = 0.9 if key == "sgd_momentum" else 0.0
        return torch.optim.SGD(
            params, lr=1e-3, momentum=momentum, foreach=foreach, fused=fused or None
        )
    raise ValueError(f"unknown optimizer {name!r}; expected adamw, adam, sgd or sgd_momentum")


# --- the measured step ---------------------------------------------------------------------


@dataclass
class StepSample:
    """What one measured training step at one micro-batch held (bytes)."""

    batch_size: int
    saved: int = 0
    """Unique storages saved for backward (parameters and buffers excluded): activations."""
    saved_outside_blocks: int = 0
    """Saved bytes produced outside the repeated blocks, plus every block's input: what
    activation checkpointing of the blocks keeps."""
    saved_per_block: list[int] = field(default_factory=list)
    """Saved bytes attributed to each block (the first block that saved a storage owns it)."""
    block_inputs: int = 0
    """Unique bytes of the blocks' inputs."""
    largest_saved: int = 0
    """The largest single saved storage."""
    inputs: int = 0
    """The batch's own tensors."""
    backward_peak: int = 0
    """Peak bytes, gradients excluded, of tensors created from forward to the end of backward."""
    grads_at_backward_peak: int = 0
    """Gradient bytes already accumulated when :attr:`backward_peak` was reached."""
    optimizer_peak: int = 0
    """Peak bytes (gradients included) during clipping + optimizer step."""
    gradients: int = 0
    optimizer_state: int = 0
    fake: bool = True
    """True when measured on fake tensors (no compute), False on a real forward + backward."""
    trace: list[tuple[int, int]] = field(default_factory=list, repr=False)
    """``(bytes alive, gradient bytes alive)`` after each operator of forward and backward:
    at another batch the same operators run, so the peak at any batch follows from two traces
    (the moment of the peak can move with the batch)."""
    marks: dict[str, list[int]] = field(default_factory=dict, repr=False)
    """Per block, the :attr:`trace` index where its ``fwd_start``, ``fwd_end``, ``bwd_start``
    and ``bwd_end`` fall (-1: not seen): where one more identical block would go."""


def _loss_of(output: Any) -> torch.Tensor:
    first = next(t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor))
    return first.float().mean()


def _autocast(
    device: torch.device, dtype: torch.dtype | None
) -> contextlib.AbstractContextManager[Any]:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


class _SavedCounter:
    """saved_tensors_hooks callbacks attributing each unique saved storage to a block."""

    def __init__(self, exclude: set[int], blocks: Sequence[nn.Module]) -> None:
        self.exclude = exclude
        self.owner: dict[int, int] = {}  # storage -> block index (-1: outside every block)
        self.sizes: dict[int, int] = {}
        self.block_inputs: dict[int, int] = {}
        self.active: list[int] = []
        self.handles: list[Any] = []
        for index, block in enumerate(blocks):
            self.handles.append(block.register_forward_pre_hook(self._enter(index)))
            self.handles.append(block.register_forward_hook(self._leave))

    def _enter(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            self.active.append(index)
            for t in tree_flatten(args)[0]:
                key = storage_key(t) if isinstance(t, torch.Tensor) else None
                if key is not None and key not in self.exclude:
                    self.block_inputs[key] = storage_bytes(t)

        return hook

    def _leave(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self.active:
            self.active.pop()

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = storage_key(tensor)
        if key is not None and key not in self.exclude and key not in self.owner:
            self.owner[key] = self.active[-1] if self.active else -1
            self.sizes[key] = storage_bytes(tensor)
        return tensor

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def fill(self, sample: StepSample, num_blocks: int) -> None:
        sample.saved = sum(self.sizes.values())
        sample.largest_saved = max(self.sizes.values(), default=0)
        sample.block_inputs = sum(self.block_inputs.values())
        per_block = [0] * num_blocks
        kept = dict(self.block_inputs)  # what checkpointing keeps: block inputs + outside
        for key, owner in self.owner.items():
            if owner < 0:
                kept[key] = self.sizes[key]
            elif key not in self.block_inputs:
                per_block[owner] += self.sizes[key]
        sample.saved_per_block = per_block
        sample.saved_outside_blocks = sum(kept.values())


def _device_of(model: nn.Module, device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    for t in (*model.parameters(), *model.buffers()):
        return t.device if t.device.type != "meta" else torch.device("cpu")
    return torch.device("cpu")


def profile_step(
    model: nn.Module,
    make_batch: BatchFactory,
    batch_size: int,
    *,
    loss_fn: LossFn | None = None,
    precision_dtype: torch.dtype | None = None,
    optimizer: str = "adamw",
    device: torch.device | str | None = None,
    foreach: bool | None = None,
    fused: bool = False,
    blocks: Sequence[nn.Module] = (),
    checkpoint_blocks: bool = False,
    fake: bool = True,
    scalars_on_host: bool = False,
    param_dtype: torch.dtype | None = None,
) -> StepSample:
    """Measure one training step of ``model`` at ``batch_size``.

    Forward (under autocast to ``precision_dtype``) with saved-tensor hooks, backward, global
    norm clipping and an optimizer step from scratch, inside a :class:`LiveTensorTracker`.
    With ``fake=True`` (the default) parameters, buffers and the batch are swapped for fake
    tensors on ``device`` for the duration: nothing is computed or allocated, the model (even
    one built on the ``meta`` device) is left untouched. With ``fake=False`` the forward and
    backward really run (the fallback for models fake tensors cannot trace); the optimizer
    step is skipped, and gradients and buffers are restored afterwards.

    Args:
        model: The model.
        make_batch: ``make_batch(n) -> (*inputs, target)`` of real tensors (CPU is fine).
        batch_size: Micro-batch to measure.
        loss_fn: ``loss_fn(output, target)``; default: the mean of the first output tensor.
        precision_dtype: Autocast dtype, or None for fp32.
        optimizer: Optimizer name (see :func:`build_optimizer`).
        device: Device the step runs on (default: the model's; CPU for a meta model).
        foreach: Optimizer implementation (None: torch's default for the device).
        fused: The fused optimizer instead (``foreach`` then None).
        blocks: Repeated blocks to attribute saved bytes to (see :func:`detect_blocks`).
        checkpoint_blocks: Run each block under activation checkpointing.
        fake: Measure on fake tensors (True) or run the real forward and backward.
        scalars_on_host: Leave 0-dim optimizer state (Adam's step counters) out, as on CUDA,
            where torch keeps them in host memory, when simulating CUDA on the CPU.
        param_dtype: Cast floating-point parameters to this dtype (fake tensors only), as
            FSDP's ``MixedPrecisionPolicy`` and DeepSpeed's bf16 mode compute: then use
            ``precision_dtype=None`` (no autocast, so no cached casts of the weights).

    Returns:
        A :class:`StepSample`.
    """
    dev = _device_of(model, device)
    sample = StepSample(batch_size=batch_size, fake=fake)
    state: contextlib.AbstractContextManager[Any]
    mode: contextlib.AbstractContextManager[Any]
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_mode = FakeTensorMode()
        mode = fake_mode

        def to_device(t: torch.Tensor) -> torch.Tensor:
            converted: torch.Tensor = fake_mode.from_tensor(t)
            if converted.device != dev:
                with fake_mode:
                    converted = converted.to(dev)
            return converted

        def convert(t: torch.Tensor) -> torch.Tensor:
            converted = to_device(t)
            if param_dtype is not None and converted.is_floating_point():
                with fake_mode:
                    converted = converted.to(param_dtype)
            return converted

        state = _swapped_state(model, convert)
        snapshot: dict[str, torch.Tensor] = {}
    else:
        mode = state = contextlib.nullcontext()
        snapshot = {k: v.detach().clone() for k, v in model.named_buffers()}

        def to_device(t: torch.Tensor) -> torch.Tensor:
            return t.to(dev)

    batch = list(make_batch(batch_size))
    was_training = model.training
    with state:
        counter = _SavedCounter(_state_keys(model), blocks)
        params = [p for p in model.parameters() if p.requires_grad]
        tracker = LiveTensorTracker()
        handles = [p.register_post_accumulate_grad_hook(_holder(tracker)) for p in params]
        handles += _mark_blocks(blocks, tracker, sample.marks)
        ckpt = _checkpointed(blocks) if checkpoint_blocks else contextlib.nullcontext()
        try:
            with mode, ckpt:
                model.train()
                tensors = [to_device(t) if isinstance(t, torch.Tensor) else t for t in batch]
                *inputs, target = tensors
                tracker.trace = sample.trace
                with tracker:
                    for t in tensors:
                        if isinstance(t, torch.Tensor):
                            tracker.track(t)
                    sample.inputs = tracker.current_bytes
                    hooks = torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t)
                    with hooks, _autocast(dev, precision_dtype):
                        output = model(*inputs)
                        loss = loss_fn(output, target) if loss_fn else _loss_of(output)
                    del output
                    loss.backward()
                    del loss
                    tracker.trace = None
                    sample.backward_peak = tracker.peak_bytes
                    sample.grads_at_backward_peak = tracker.held_at_peak
                    sample.gradients = _unique_bytes([p.grad for p in params if p.grad is not None])
                    if fake:
                        tracker.reset_peak()
                        torch.nn.utils.clip_grad_norm_(params, 1.0)
                        opt = build_optimizer(optimizer, params, foreach=foreach, fused=fused)
                        opt.step()
                        sample.optimizer_peak = tracker.peak_total
                        # Adam's step counters stay on the CPU unless capturable: not GPU memory.
                        sample.optimizer_state = _unique_bytes(
                            [
                                v
                                for s in opt.state.values()
                                for v in s.values()
                                if isinstance(v, torch.Tensor)
                                and v.device == dev
                                and (v.dim() > 0 or not scalars_on_host)
                            ]
                        )
                        del opt
        finally:
            for handle in handles:
                handle.remove()
            for p in params:
                p.grad = None
            counter.remove()
            model.train(was_training)
            if snapshot:
                with torch.no_grad():
                    for name, buf in model.named_buffers():
                        buf.copy_(snapshot[name])
    counter.fill(sample, len(blocks))
    return sample


def _mark_blocks(
    blocks: Sequence[nn.Module], tracker: LiveTensorTracker, marks: dict[str, list[int]]
) -> list[Any]:
    """Hooks that note where each block's forward and backward begin and end in the trace."""
    for kind in ("fwd_start", "fwd_end", "bwd_start", "bwd_end"):
        marks[kind] = [-1] * len(blocks)

    def mark(kind: str, index: int) -> None:
        if marks[kind][index] < 0 and tracker.trace is not None:
            marks[kind][index] = len(tracker.trace)

    def on_grad(kind: str, index: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            mark(kind, index)

        return hook

    def first_grad_tensor(value: Any) -> torch.Tensor | None:
        for t in tree_flatten(value)[0]:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                return t
        return None

    def enter(index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            mark("fwd_start", index)
            tensor = first_grad_tensor(args)
            if tensor is not None:  # its gradient is ready when the block's backward is done
                tensor.register_hook(on_grad("bwd_end", index))

        return hook

    def leave(index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            mark("fwd_end", index)
            tensor = first_grad_tensor(output)
            if tensor is not None:  # its gradient arriving starts the block's backward
                tensor.register_hook(on_grad("bwd_start", index))

        return hook

    handles = []
    for index, block in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(enter(index)))
        handles.append(block.register_forward_hook(leave(index)))
    return handles


def _holder(tracker: LiveTensorTracker) -> Callable[[torch.Tensor], None]:
    def hook(param: torch.Tensor) -> None:
        if param.grad is not None:
            tracker.hold(param.grad)

    return hook


def measure_activation_bytes(
    model: nn.Module,
    batch: Sequence[Any],
    loss_fn: LossFn | None = None,
    *,
    precision_dtype: torch.dtype | None = None,
) -> int:
    """Bytes saved for backward by one real forward: the ground truth for activations.

    Runs ``model(*inputs)`` and ``loss_fn(output, target)`` under
    :func:`torch.autograd.graph.saved_tensors_hooks` and sums the unique storages saved,
    parameters and buffers excluded. The graph is freed without a backward pass.

    Args:
        model: The model, in the mode to measure (call ``model.train()`` first for training).
        batch: ``(*inputs, target)`` on the model's device.
        loss_fn: ``loss_fn(output, target)``; default: mean of the first output tensor.
        precision_dtype: Autocast dtype, or None for fp32.

    Returns:
        Bytes.

    Example:
        >>> model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
        >>> batch = (torch.randn(32, 64), torch.randint(10, (32,)))
        >>> measure_activation_bytes(model, batch, nn.functional.cross_entropy)
        42500

        That is the input (8 KiB), the ReLU output that the second Linear also saves (32 KiB,
        counted once), the log-softmax (1.25 KiB), the targets (256 B) and the loss's scalar.
    """
    exclude = _state_keys(model)
    counter = _SavedCounter(exclude, ())
    *inputs, target = batch
    param = next(iter(model.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    hooks = torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t)
    with hooks, _autocast(device, precision_dtype):
        output = model(*inputs)
        loss = loss_fn(output, target) if loss_fn else _loss_of(output)
    del output, loss
    return sum(counter.sizes.values())
