"""DeepSpeed ZeRO-1/2/3 checkpoints read as per-parameter full tensors, memory-mapped.

DeepSpeed writes one optimizer file per rank: its partition of the fp32 master weights and
of the optimizer's moments, flattened. :class:`ZeroSource` maps every rank's file (nothing is
read until used) and gives back one parameter at a time, whole — its fp32 weight, ``exp_avg``,
``exp_avg_sq`` and ``step`` — by cutting it out of the partitions that hold it, the layout
DeepSpeed's own ``zero_to_fp32`` and ``ds_to_universal`` read:

- ZeRO-1/2: each param group is one flat vector (parameters in order, each followed by its
  alignment padding), cut into equal partitions, rank ``r`` holding the ``r``-th;
- ZeRO-3: every parameter is cut into ``ceil(numel / world_size)`` elements per rank
  (zero-padded), and rank ``r``'s flat vector is its pieces of every parameter in order.

A parameter that one partition holds whole comes back as a view of the mapped file (no copy);
one cut across partitions is copied together, one parameter at a time. Any rank can read any
parameter: no collective, no rank holding every partition in its memory.

Trust: our own ``torch.load(weights_only=True)`` with DeepSpeed's four plain-data classes
allowed (:func:`~gpu_training.checkpoint.zero_read.load_deepspeed_file`); DeepSpeed's readers
are not called. :func:`zero_layout` says how a checkpoint was laid out (stage, ranks, offload),
which decides whether DeepSpeed's own load can read it as it is.

Example:
    >>> source = ZeroSource(step_dir)  # doctest: +SKIP
    >>> full = source.read(["wte.weight"])["wte.weight"]  # doctest: +SKIP
    >>> full.weight.shape, sorted(full.state)  # doctest: +SKIP
    (torch.Size([72, 32]), ['exp_avg', 'exp_avg_sq', 'step'])
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpu_training.checkpoint.files import EXTRA_NAME, CheckpointError
from gpu_training.checkpoint.full_state import ParamState
from gpu_training.checkpoint.keys import parameter_name
from gpu_training.checkpoint.loss_scale import RUN_STATE_KEY, deepspeed_loss_scale
from gpu_training.checkpoint.safe_load import load_plain
from gpu_training.checkpoint.zero_read import load_deepspeed_file

__all__ = ["ZeroLayout", "ZeroSource", "zero_layout", "zero_shapes"]

_OPTIM_RE = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$")
_MODEL_NAMES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")


@dataclass(frozen=True)
class ZeroLayout:
    """How a ZeRO run laid its state out: what DeepSpeed's own load needs to be the same."""

    stage: int
    world_size: int
    offload_optimizer: str
    """``"none"``, ``"cpu"`` or ``"nvme"``."""
    offload_param: str


def _device(section: object) -> str:
    device = section.get("device") if isinstance(section, Mapping) else None
    return str(getattr(device, "value", device) or "none")


def _model_file(step_dir: Path) -> Path:
    for name in _MODEL_NAMES:
        if (step_dir / name).is_file():
            return step_dir / name
    raise CheckpointError(f"{step_dir} holds no DeepSpeed model-states file ({_MODEL_NAMES[0]})")


def zero_layout(step_dir: Path, *, trusted: bool = False) -> ZeroLayout:
    """Stage, ranks and offload of a DeepSpeed checkpoint, from its rank-0 model-states file.

    Raises:
        CheckpointError: The file is missing, refused or holds no DeepSpeed config.
    """
    model = load_deepspeed_file(_model_file(step_dir), trusted=trusted)
    config = model.get("ds_config")
    zero = config.get("zero_optimization") if isinstance(config, Mapping) else None
    if not isinstance(zero, Mapping):
        raise CheckpointError(f"{_model_file(step_dir)} records no ZeRO config ('ds_config')")
    return ZeroLayout(
        stage=int(zero.get("stage", 0)),
        world_size=int(model.get("dp_world_size", 0)),
        offload_optimizer=_device(zero.get("offload_optimizer")),
        offload_param=_device(zero.get("offload_param")),
    )


def zero_shapes(step_dir: Path) -> dict[str, tuple[int, ...]] | None:
    """Name -> shape of the model a ZeRO checkpoint holds, from its rank-0 model-states file.

    The trained parameters' ``param_shapes`` (and ``frozen_param_shapes`` where saved) and the
    module's buffers; the file is mapped and read under the allow-list, no tensor is read.
    None where that cannot be said cheaply (ZeRO stage 0, or a file that needs
    ``--trust-checkpoint``): every rank then checks the shapes as it loads.
    """
    try:
        model = load_deepspeed_file(_model_file(step_dir))
    except CheckpointError:
        return None
    groups = model.get("param_shapes")
    if not isinstance(groups, list):
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    frozen = model.get("frozen_param_shapes")
    for group in [*groups, frozen if isinstance(frozen, Mapping) else {}]:
        for name, shape in group.items():
            shapes[parameter_name(str(name))] = tuple(int(d) for d in shape)
    shared = model.get("shared_params")  # tied weights: name -> the parameter it shares
    for name, owner in shared.items() if isinstance(shared, Mapping) else ():
        if parameter_name(str(owner)) in shapes:
            shapes[parameter_name(str(name))] = shapes[parameter_name(str(owner))]
    module = model.get("module")
    for name in model.get("buffer_names") or ():
        if isinstance(module, Mapping) and isinstance(module.get(name), torch.Tensor):
            shapes[parameter_name(str(name))] = tuple(module[name].shape)
    return shapes


class _Flat:
    """Several 1-d tensors read as one (a rank's partitions of a group, every rank's...)."""

    def __init__(self, parts: Sequence[torch.Tensor]) -> None:
        self.parts = list(parts)
        self.starts = [0]
        for part in self.parts:
            self.starts.append(self.starts[-1] + part.numel())

    @property
    def numel(self) -> int:
        return self.starts[-1]

    def read(self, start: int, length: int) -> torch.Tensor:
        """Elements ``start`` to ``start + length``: a view when one part holds them all."""
        if start < 0 or start + length > self.numel:
            raise CheckpointError(
                f"a parameter lies beyond its partitions ({start}+{length} of {self.numel})"
            )
        pieces = []
        for part, begin, end in zip(self.parts, self.starts, self.starts[1:], strict=False):
            lo, hi = max(start, begin), min(start + length, end)
            if lo < hi:
                pieces.append(part.reshape(-1).narrow(0, lo - begin, hi - lo))
        if len(pieces) == 1:
            return pieces[0]
        return torch.cat(pieces) if pieces else torch.empty(0)


def _step(count: Any) -> torch.Tensor | None:
    """A step count as torch's Adam keeps it (DeepSpeed's own Adams keep a Python int)."""
    if count is None:
        return None
    value = count.item() if isinstance(count, torch.Tensor) else count
    return torch.tensor(float(value), dtype=torch.float32)


@dataclass
class _Place:
    """Where one parameter lives: its group, its offset in it, its shape."""

    group: int
    offset: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class ZeroSource:
    """A DeepSpeed ZeRO-1/2/3 checkpoint, per parameter (see the module docstring).

    Args:
        step_dir: A committed ``"deepspeed"`` step directory, verified against its manifest.
        trusted: Unpickle DeepSpeed's files without the allow-list (``--trust-checkpoint``).

    Raises:
        CheckpointError: The files are refused, incomplete, or of a kind not read here
            (DeepSpeed's bf16 optimizer, mixture-of-experts files).
    """

    batch_bytes = 0  # mapped files: one parameter per read, the least memory

    def __init__(self, step_dir: Path, *, trusted: bool = False) -> None:
        self._step_dir = step_dir
        found = sorted(
            (int(m.group(2)), m.group(1), step_dir / m.group(0))
            for m in (_OPTIM_RE.match(p.name) for p in step_dir.iterdir())
            if m is not None
        )
        if not found:
            raise CheckpointError(f"{step_dir} holds no DeepSpeed optimizer files")
        if any(bf16 for _, bf16, _ in found) or any(step_dir.glob("*expert_*")):
            raise CheckpointError(
                f"{step_dir} was written by DeepSpeed's bf16 optimizer or with experts: it "
                "resumes only on the layout it was written with"
            )
        if [rank for rank, _, _ in found] != list(range(len(found))):
            raise CheckpointError(f"{step_dir}: the ranks' optimizer files are not all there")
        model = load_deepspeed_file(_model_file(step_dir), trusted=trusted)
        optim = [load_deepspeed_file(f, trusted=trusted)["optimizer_state_dict"] for *_, f in found]
        self.world_size = len(optim)
        self.stage = int(optim[0].get("zero_stage", 0))
        # the ranks' scalers agree (overflows are reduced): rank 0's is the run's fp16 scale
        skipped = int(model.get("skipped_steps") or 0)
        self._loss_scale = deepspeed_loss_scale(optim[0].get("loss_scaler"), skipped)
        shapes = model.get("param_shapes")
        if not isinstance(shapes, list) or not self.stage:
            raise CheckpointError(f"{step_dir} is not a ZeRO checkpoint (no param_shapes)")
        self.names: list[str] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self._places: dict[str, _Place] = {}
        if self.stage <= 2:
            self._weights, self._states, self._steps = self._zero12(optim, shapes)
        else:
            self._weights, self._states, self._steps = self._zero3(optim, shapes)
        names = set(model.get("buffer_names") or ())
        module = model.get("module") or {}
        self._buffers = {parameter_name(k): v for k, v in module.items() if k in names}

    # -- the two layouts -----------------------------------------------------------------------

    def _place(self, name: str, group: int, offset: int, shape: object) -> int:
        clean = parameter_name(str(name))
        size = tuple(int(d) for d in shape)  # type: ignore[attr-defined]
        self.names.append(clean)
        self.shapes[clean] = size
        self._places[clean] = _Place(group, offset, size)
        return math.prod(size)

    def _zero12(
        self, optim: list[dict[str, Any]], shapes: list[Mapping[str, Any]]
    ) -> tuple[list[_Flat], list[dict[str, _Flat]], list[torch.Tensor | None]]:
        """Each param group one flat vector over the ranks' partitions (padding removed)."""
        paddings = optim[0].get("param_alignment_paddings")
        weights, states, steps = [], [], []
        for g, group_shapes in enumerate(shapes):
            parts = [sd["single_partition_of_fp32_groups"][g] for sd in optim]
            weights.append(_Flat(parts))
            group_states, step = self._zero12_state(optim, g, [p.numel() for p in parts])
            states.append(group_states)
            steps.append(step)
            offset = 0
            for i, (name, shape) in enumerate(group_shapes.items()):
                offset += self._place(name, g, offset, shape)
                offset += int(paddings[g][i]) if paddings is not None else 0
            if offset > weights[-1].numel:
                raise CheckpointError(
                    f"{self._step_dir}: param group {g} needs {offset} elements and its "
                    f"partitions hold {weights[-1].numel}"
                )
        return weights, states, steps

    @staticmethod
    def _zero12_state(
        optim: list[dict[str, Any]], g: int, lengths: list[int]
    ) -> tuple[dict[str, _Flat], torch.Tensor | None]:
        """Group ``g``'s flat optimizer state over the ranks, and its step (None: no state)."""
        per_rank = []
        for sd in optim:
            saved = sd["base_optimizer_state"]
            if isinstance(saved, Mapping):  # the optimizer's state_dict
                state = dict((saved.get("state") or {}).get(g) or {})
                group = (saved.get("param_groups") or [{}])[g]
                if state and "step" not in state and "step" in group:  # older FusedAdam's
                    state["step"] = group["step"]
            else:  # DeepSpeed's elastic checkpoints: one lean state per group, step beside
                state = dict(saved[g])
                if "base_optimizer_state_step" in sd:
                    state["step"] = sd["base_optimizer_state_step"]
            per_rank.append(state)
        if not per_rank[0]:
            return {}, None
        step = per_rank[0].get("step")
        keys = [k for k, v in per_rank[0].items() if isinstance(v, torch.Tensor) and v.dim() == 1]
        flats = {k: _Flat([s[k][:n] for s, n in zip(per_rank, lengths, strict=True)]) for k in keys}
        return flats, _step(step)

    def _zero3(
        self, optim: list[dict[str, Any]], shapes: list[Mapping[str, Any]]
    ) -> tuple[list[_Flat], list[dict[str, _Flat]], list[torch.Tensor | None]]:
        """Every rank's sub-groups as one flat vector; each parameter a piece of each."""
        weights = [_Flat(sd["fp32_flat_groups"]) for sd in optim]
        inner = [sd.get("optimizer_state_dict") or {} for sd in optim]
        states: list[dict[str, _Flat]] = []
        saved = [inner_sd.get("state") or {} for inner_sd in inner]
        step = None
        if saved[0]:
            first = saved[0][min(saved[0])]
            step = first.get("step")
            keys = [k for k, v in first.items() if isinstance(v, torch.Tensor) and v.dim() == 1]
            for rank_state in saved:
                subgroups = [rank_state[i] for i in sorted(rank_state)]
                states.append({k: _Flat([s[k] for s in subgroups]) for k in keys})
        offset = 0
        for group_shapes in shapes:
            for name, shape in group_shapes.items():
                numel = self._place(name, 0, offset, shape)
                offset += math.ceil(numel / self.world_size)
        if offset > weights[0].numel:
            raise CheckpointError(
                f"{self._step_dir}: its parameters need {offset} elements per rank and rank 0 "
                f"holds {weights[0].numel}"
            )
        return weights, states, [_step(step)]

    # -- reading -------------------------------------------------------------------------------

    def _gather(self, flats: Sequence[_Flat], place: _Place) -> torch.Tensor:
        """One parameter's elements, whole, from the ranks' flat vectors."""
        if self.stage <= 2:
            return flats[place.group].read(place.offset, place.numel).view(place.shape)
        piece = math.ceil(place.numel / self.world_size)
        parts = [flat.read(place.offset, piece) for flat in flats]
        whole = parts[0] if len(parts) == 1 else torch.cat(parts)
        return whole[: place.numel].view(place.shape)

    def read(self, names: Sequence[str]) -> dict[str, ParamState]:
        """Each parameter whole: fp32 weight, moments, step (views where no copy is needed)."""
        out = {}
        for name in names:
            place = self._places.get(name)
            if place is None:
                raise CheckpointError(f"{self._step_dir} holds no parameter '{name}'")
            if self.stage <= 2:  # one flat vector per group, over every rank
                weight = self._gather([self._weights[place.group]], place)
                flats = self._states[place.group]
                moments = {k: self._gather([flat], place) for k, flat in flats.items()}
                step = self._steps[place.group]
            else:  # one flat vector per rank, over every group
                weight = self._gather(self._weights, place)
                keys = self._states[0] if self._states else {}
                moments = {k: self._gather([s[k] for s in self._states], place) for k in keys}
                step = self._steps[0]
            state: dict[str, torch.Tensor] = dict(moments)
            if step is not None and moments:
                state["step"] = step.detach().clone()
            out[name] = ParamState(weight, state)
        return out

    def buffers(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """The named buffers DeepSpeed saved with the module."""
        return {n: self._buffers[n] for n in names if n in self._buffers}

    def run_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``extra.pt``: both the run state and the caller's extra; the run state with the fp16
        loss scale DeepSpeed kept in its own files (``loss_scale``, where it was dynamic)."""
        extra = self._step_dir / EXTRA_NAME
        plain = load_plain(extra) if extra.exists() else {}
        if self._loss_scale is None:
            return plain, plain
        return {**plain, RUN_STATE_KEY: self._loss_scale.to_dict()}, plain
