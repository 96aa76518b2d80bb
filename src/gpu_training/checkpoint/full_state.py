"""Per-parameter full state: what resharding reads from one checkpoint format into another.

Any checkpoint is read as *per-parameter full tensors*: each trainable parameter's weight
(fp32, whole) and its optimizer state (AdamW's ``exp_avg``, ``exp_avg_sq``, whole, and its
``step``), a few parameters at a time. A :class:`ParamSource` reads them —
:class:`PlainSource` (a memory-mapped ``state.pt``), :class:`DcpSource` (DCP shards, a batch of
parameters per read) and :class:`~gpu_training.checkpoint.zero_source.ZeroSource` (DeepSpeed's
ZeRO files, memory-mapped) — and a sink writes them into a run's own layout:
:func:`load_into_module` (a plain, DDP or FSDP2 model and its torch optimizer) or
:func:`~gpu_training.checkpoint.zero_sink.load_into_engine` (a DeepSpeed ZeRO engine).

Memory: a sink keeps its rank's share of every tensor (what its layout holds) and, beyond it,
the full parameters of one read: one parameter from a memory-mapped source (read through the
page cache), a batch of at most :data:`BATCH_BYTES` from DCP (or one parameter when larger).

The learning rate is not part of a parameter's state: the LR schedule's restore sets it
(:func:`~gpu_training.resume.restore_run_state`); the other hyper-parameters are the job's,
which the resume guard keeps the same.

Example:
    >>> import torch
    >>> source = PlainSource.from_state(
    ...     {"model_state": {"w": torch.ones(2)},
    ...      "optimizer_state": {"state": {0: {"step": torch.tensor(3.0),
    ...                                        "exp_avg": torch.zeros(2)}},
    ...                          "param_groups": [{"lr": 0.1, "params": [0]}]}},
    ...     [["w"]])
    >>> source.read(["w"])["w"].state["step"].item()
    3.0
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from gpu_training.checkpoint.files import EXTRA_NAME, STATE_NAME, CheckpointError
from gpu_training.checkpoint.keys import parameter_name, strip_wrapper_prefixes
from gpu_training.checkpoint.safe_load import load_plain
from gpu_training.ddp import unwrap_model

__all__ = [
    "BATCH_BYTES",
    "DcpSource",
    "ModuleSink",
    "ParamSource",
    "ParamState",
    "PlainSource",
    "Sink",
    "batches",
    "check_names",
    "load_into_module",
    "module_order",
]

BATCH_BYTES = 32 * 2**20
"""How many bytes of full parameters (weight and optimizer state) one DCP read takes at most."""

_WHOLE = ("model_state", "optimizer_state")


@dataclass
class ParamState:
    """One parameter, whole: its weight and its optimizer state."""

    weight: torch.Tensor
    """The full weight in the saved shape (the fp32 master copy where there is one)."""
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    """Optimizer state: tensors shaped like the weight, and 0-dim ones (``step``); empty when
    the run had not stepped."""


class ParamSource(Protocol):
    """A checkpoint read as per-parameter full tensors (see the module docstring)."""

    names: list[str]
    """Its trainable parameters, as state dicts name them, in its optimizer's order."""
    shapes: dict[str, tuple[int, ...]]
    """Their shapes."""
    batch_bytes: int
    """Bytes of full parameters one :meth:`read` should take at most; 0: one parameter."""

    def read(self, names: Sequence[str]) -> dict[str, ParamState]:
        """The named parameters, whole (views of a mapped file where that costs no copy)."""
        ...

    def buffers(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """Those of the model's buffers ``names`` it saved, by state-dict name."""
        ...

    def run_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The run state saved beside the model and the caller's extra, as a format's load
        returns them."""
        ...


def batches(names: Sequence[str], sizes: Mapping[str, int], budget: int) -> Iterator[list[str]]:
    """``names`` in order, cut into runs of at most ``budget`` bytes (one name at least)."""
    batch: list[str] = []
    used = 0
    for name in names:
        if batch and used + sizes[name] > budget:
            yield batch
            batch, used = [], 0
        batch.append(name)
        used += sizes[name]
    if batch:
        yield batch


def check_names(
    source: ParamSource, wanted: Mapping[str, tuple[int, ...]], *, what: str = "model"
) -> None:
    """The source holds exactly the parameters ``wanted`` (name -> global shape).

    Raises:
        CheckpointError: Naming the first parameter whose shape differs, or that one side lacks.
    """
    saved = source.shapes
    differ = [k for k in wanted if k in saved and tuple(saved[k]) != tuple(wanted[k])]
    missing = [k for k in wanted if k not in saved]
    unexpected = [k for k in saved if k not in wanted]
    if differ or missing or unexpected:
        k = (differ or missing or unexpected)[0]
        there = list(saved[k]) if k in saved else "missing"
        here = list(wanted[k]) if k in wanted else "missing"
        raise CheckpointError(
            f"it was written by a {what} of another shape: '{k}' is {there} there and {here} "
            "in this job; use the task options it was written with"
        )


# ----------------------------------------------------------------------------------------------
# sources


class PlainSource:
    """A plain ``state.pt``, memory-mapped: its optimizer state is keyed by parameter index.

    Args:
        state: What ``state.pt`` holds (``model_state``, ``optimizer_state``, the run state).
        order: The loading run's trainable parameter names, by optimizer param group, in its
            optimizer's order: index ``i`` of the saved optimizer state is the ``i``-th.
    """

    batch_bytes = 0  # views of a mapped file: one parameter per read costs nothing more

    def __init__(self, state: Mapping[str, Any], order: Sequence[Sequence[str]]) -> None:
        model = state.get("model_state")
        if not isinstance(model, Mapping):
            raise CheckpointError("it holds no model state ('model_state')")
        self._model = strip_wrapper_prefixes(model)
        self._rest = {k: v for k, v in state.items() if k not in _WHOLE}
        self.names = [name for group in order for name in group]
        self.shapes = {n: tuple(self._model[n].shape) for n in self.names if n in self._model}
        self._by_name = _optimizer_by_name(state.get("optimizer_state"), order)

    @classmethod
    def from_state(cls, state: Mapping[str, Any], order: Sequence[Sequence[str]]) -> PlainSource:
        """From a ``state.pt`` already read (see the class)."""
        return cls(state, order)

    @classmethod
    def open(cls, step_dir: Path, order: Sequence[Sequence[str]]) -> PlainSource:
        """``step_dir/state.pt``, memory-mapped (pages are read when a tensor is used)."""
        return cls(load_plain(step_dir / STATE_NAME, mmap=True), order)

    def read(self, names: Sequence[str]) -> dict[str, ParamState]:
        """Views of the mapped file: nothing is copied here."""
        return {n: ParamState(self._model[n], dict(self._by_name.get(n, {}))) for n in names}

    def buffers(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """The named buffers ``state.pt`` holds (views of the mapped file)."""
        return {n: self._model[n] for n in names if n in self._model}

    def run_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``state.pt`` without its model and optimizer, and its ``"extra"``."""
        return dict(self._rest), dict(self._rest.get("extra") or {})


def _optimizer_by_name(
    saved: object, order: Sequence[Sequence[str]]
) -> dict[str, dict[str, torch.Tensor]]:
    """A plain optimizer state's per-parameter state, keyed by parameter name."""
    whole: Mapping[str, Any] = saved if isinstance(saved, Mapping) else {}
    groups = whole.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, Mapping) for g in groups):
        raise CheckpointError("it holds no optimizer state ('optimizer_state')")
    sizes = [len(g.get("params", ())) for g in groups]
    wanted = [len(g) for g in order]
    if sizes != wanted:
        raise CheckpointError(
            f"its optimizer has param groups of {sizes} parameters and this run's of {wanted}: "
            "resume with the optimizer it was written with"
        )
    by_index = whole.get("state") or {}
    out: dict[str, dict[str, torch.Tensor]] = {}
    for group, names in zip(groups, order, strict=True):
        for index, name in zip(group["params"], names, strict=True):
            if index in by_index:
                out[name] = dict(by_index[index])
    return out


class DcpSource:
    """A sharded (DCP) checkpoint, read a batch of parameters at a time in this process.

    Every rank reads what it asks for from the shared files: no collective. The index and
    every value go through :mod:`~gpu_training.checkpoint.dcp_read` (allow-lists).

    Args:
        step_dir: A committed sharded step directory, verified.
        files: The names its manifest lists.
        order: The loading run's trainable parameter names, by optimizer param group.
    """

    batch_bytes = BATCH_BYTES  # each read opens DCP's index: a few parameters per read

    def __init__(self, step_dir: Path, files: Sequence[str], order: Sequence[Sequence[str]]):
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        from gpu_training.checkpoint.dcp_read import check_dcp_storage, read_dcp_metadata

        check_dcp_storage(step_dir, files)
        metadata = read_dcp_metadata(step_dir / ".metadata")
        tensors = {
            fqn: tuple(meta.size)
            for fqn, meta in metadata.state_dict_metadata.items()
            if isinstance(meta, TensorStorageMetadata)
        }
        self._step_dir = step_dir
        self._model = {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
        self.names = [name for group in order for name in group]
        self.shapes = {n: self._model[n] for n in self.names if n in self._model}
        optim = [k.removeprefix("optim.state.") for k in tensors if k.startswith("optim.state.")]
        self._stepped = {k.rsplit(".", 1)[0] for k in optim}  # "<fqn>.<state key>"

    def read(self, names: Sequence[str]) -> dict[str, ParamState]:
        """One DCP read for all of ``names`` (weights and optimizer state, whole)."""
        from gpu_training.checkpoint.dcp_read import load_keys

        keys = [f"model.{n}" for n in names]
        keys += [f"optim.state.{n}" for n in names if n in self._stepped]
        loaded = load_keys(self._step_dir, keys)
        weights = loaded.get("model") or {}
        states = (loaded.get("optim") or {}).get("state") or {}
        out = {}
        for name in names:
            if name not in weights:
                raise CheckpointError(f"{self._step_dir} holds no weight for '{name}'")
            out[name] = ParamState(weights[name], dict(states.get(name) or {}))
        return out

    def buffers(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """The named buffers the checkpoint holds, read now."""
        from gpu_training.checkpoint.dcp_read import load_keys

        keys = [f"model.{n}" for n in names if n in self._model]
        return dict(load_keys(self._step_dir, keys).get("model") or {}) if keys else {}

    def run_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``extra.pt``: both the run state and the caller's extra."""
        extra = self._step_dir / EXTRA_NAME
        plain = load_plain(extra) if extra.exists() else {}
        return plain, plain


# ----------------------------------------------------------------------------------------------
# the torch sink


def module_order(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The names of ``optimizer``'s parameters, by param group, as state dicts name them.

    Raises:
        CheckpointError: ``optimizer`` updates a tensor that is not ``model``'s parameter.
    """
    names = {id(p): parameter_name(n) for n, p in unwrap_model(model).named_parameters()}
    order = []
    for group in optimizer.param_groups:
        if any(id(p) not in names for p in group["params"]):
            raise CheckpointError(
                "the optimizer holds tensors that are not the model's parameters: create it "
                "after fully_shard(), from model.parameters()"
            )
        order.append([names[id(p)] for p in group["params"]])
    return order


class Sink(Protocol):
    """A run's model and optimizer as resharding fills them (see the module docstring)."""

    order: list[list[str]]
    """Its trainable parameter names by optimizer param group, in its optimizer's order."""

    def check(self, source: ParamSource) -> None:
        """Refuses a source of another model before anything is written; no collective."""
        ...

    def begin(self) -> None:
        """Every rank, before :meth:`fill` (ZeRO-3: a collective)."""
        ...

    def fill(self, source: ParamSource) -> None:
        """Writes this rank's share of every tensor; no collective."""
        ...

    def end(self) -> None:
        """Every rank, after every rank's :meth:`fill` succeeded (ZeRO-3: a collective)."""
        ...


class ModuleSink:
    """A plain, DDP or FSDP2 model and its torch optimizer, as resharding fills them.

    Each parameter's weight and optimizer state are cut to this rank's shard (an FSDP2
    ``DTensor`` keeps its own rows, a plain tensor all of it) and copied in; buffers the source
    saved are copied too. Build the optimizer before loading; its param groups (learning
    rate included: the LR schedule's restore sets it) stay as built. No collective.

    Args:
        model: The model to fill, sharded with ``fully_shard`` or not (wrapped or not).
        optimizer: Its optimizer, built from its parameters.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = unwrap_model(model), optimizer
        self.order = module_order(model, optimizer)
        self._params = {parameter_name(n): p for n, p in self.model.named_parameters()}

    def check(self, source: ParamSource) -> None:
        """The source holds this model's parameters, of the same shapes."""
        names = [name for group in self.order for name in group]
        check_names(source, {n: tuple(self._params[n].shape) for n in names})

    def begin(self) -> None:
        """Nothing to do."""

    def end(self) -> None:
        """Nothing to do."""

    def fill(self, source: ParamSource) -> None:
        """Weights, optimizer state and buffers, this rank's shard of each."""
        order = [name for group in self.order for name in group]
        index = {name: i for i, name in enumerate(order)}
        sizes = {n: self._params[n].numel() * 4 * 3 for n in order}
        by_index: dict[int, dict[str, Any]] = {}
        with torch.no_grad():
            for batch in batches(order, sizes, source.batch_bytes):
                for name, full in source.read(batch).items():
                    param = self._params[name]
                    param.copy_(_shard_like(param, full.weight))
                    if full.state:
                        by_index[index[name]] = {
                            k: _shard_like(param, v) if v.dim() else v.detach().clone()
                            for k, v in full.state.items()
                        }
            buffers = {parameter_name(n): b for n, b in self.model.named_buffers()}
            for name, value in source.buffers(list(buffers)).items():
                buffers[name].copy_(value)
        if by_index:  # a checkpoint of a run that never stepped has none to carry
            groups = self.optimizer.state_dict()["param_groups"]
            self.optimizer.load_state_dict({"state": by_index, "param_groups": groups})


def load_into_module(
    model: nn.Module, optimizer: torch.optim.Optimizer, source: ParamSource
) -> None:
    """Fills a plain, DDP or FSDP2 model and its optimizer from ``source``: :class:`ModuleSink`.

    Raises:
        CheckpointError: The source's parameters differ from the model's (names, shapes).
    """
    sink = ModuleSink(model, optimizer)
    sink.check(source)
    sink.fill(source)


def _shard_like(param: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """``full`` as ``param`` holds it on this rank: its own shard of a DTensor, else all.

    The result owns its memory (a slice of a mapped file or of a batch would keep them alive).
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    full = full.detach().reshape(param.shape)
    if not isinstance(param, DTensor):
        return full.to(device=param.device, dtype=param.dtype, copy=True)
    # src_data_rank=None: every rank holds the full tensor already; no scatter
    spread = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
    local = spread.to_local().to(dtype=param.dtype, copy=True)
    return DTensor.from_local(
        local,
        param.device_mesh,
        param.placements,
        run_check=False,
        shape=spread.shape,
        stride=spread.stride(),
    )
