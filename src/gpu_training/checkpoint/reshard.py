"""A plain checkpoint read into a sharded (FSDP2) run, on any world size.

The other direction needs nothing new: a DCP checkpoint loads into any model, FSDP2 or plain
(:func:`~gpu_training.checkpoint.sharded.load_sharded`). A plain ``state.pt`` holds whole
tensors and an optimizer state keyed by parameter index; :func:`load_plain_resharded` puts
it into an FSDP2 model and its optimizer:

- every rank memory-maps ``state.pt`` (its pickle is read, no tensor), checks the names and
  shapes against its model, and names the optimizer state's parameters through its own
  optimizer (:func:`optimizer_state_by_name`);
- rank 0 broadcasts one tensor at a time (``set_model_state_dict`` and
  ``set_optimizer_state_dict``, ``full_state_dict`` with ``broadcast_from_rank0``) and each
  rank keeps its shard. No rank copies the whole optimizer state into its own memory: rank 0
  reads the tensors through the map, from the page cache.

The plain run state beside them (step, schedule, scaler, sampler, RNG streams, the caller's
extra) is returned, as every format's load returns it.

Example:
    >>> ckpt.load_plain_into(fsdp_model, optimizer, 10)["step"]  # every rank  # doctest: +SKIP
    10
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from gpu_training.checkpoint.attempt import Attempt, settle, uses_process_group
from gpu_training.checkpoint.collective import choose_verified
from gpu_training.checkpoint.directory import CheckpointDirectory, PathOrStep
from gpu_training.checkpoint.files import STATE_NAME, CheckpointError
from gpu_training.checkpoint.formats import PLAIN
from gpu_training.checkpoint.keys import parameter_name, strip_wrapper_prefixes
from gpu_training.checkpoint.safe_load import load_plain
from gpu_training.ddp import DistributedContext, unwrap_model

__all__ = ["load_plain_resharded", "optimizer_state_by_name"]

_WHOLE = ("model_state", "optimizer_state")


def load_plain_resharded(
    store: CheckpointDirectory,
    ctx: DistributedContext,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    path_or_step: PathOrStep | None = None,
) -> dict[str, Any]:
    """Loads a plain checkpoint into ``model`` (FSDP2 or not) and ``optimizer``; every rank.

    Each rank checksums a share of the files first; with no ``path_or_step`` the newest plain
    checkpoint that verifies is taken. Build the optimizer before loading. Usually called as
    ``CheckpointManager.load_plain_into(...)``.

    Args:
        store: The checkpoint root.
        ctx: This rank's identity.
        model: The model to fill, sharded with ``fully_shard`` or not.
        optimizer: Its optimizer (AdamW moments and step counts are resharded into it).
        path_or_step: A checkpoint directory, a step number, or None for the newest.

    Returns:
        ``state.pt`` without its model and optimizer: the run state and the caller's extra.

    Raises:
        CheckpointError: On every rank, if there is no such checkpoint, it fails
            verification, its model has other names or shapes, its optimizer other param
            groups, or any rank failed.
    """
    distributed = uses_process_group(ctx)
    chosen = choose_verified(store, ctx, path_or_step, PLAIN)
    what = f"could not load {chosen}"
    state: dict[str, Any] = {}
    weights: dict[str, Any] = {}
    moments: dict[str, Any] = {}
    with Attempt() as prepare:
        state = load_plain(chosen / STATE_NAME, mmap=True)  # pages are read when used
        weights = _model_state(state, model)
        moments = optimizer_state_by_name(state.get("optimizer_state"), model, optimizer)
        missing = [name for group in moments["param_groups"] for name in group["params"]]
        missing = [name for name in missing if name not in weights]
        if missing:
            raise CheckpointError(f"its optimizer names '{missing[0]}', which the model lacks")
    settle(ctx, prepare, what)  # before the broadcasts: their collectives need every rank

    with Attempt() as load:
        source = ctx.is_main_process or not distributed
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed)
        set_model_state_dict(model, weights if source else {}, options=options)
        if moments["state"]:  # a checkpoint of a run that never stepped has none to carry
            set_optimizer_state_dict(model, optimizer, moments if source else {}, options=options)
    settle(ctx, load, what)
    return {k: v for k, v in state.items() if k not in _WHOLE}


def optimizer_state_by_name(
    saved: object, model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """A plain optimizer state (keyed by parameter index) keyed by parameter name instead.

    The saved param groups are matched with ``optimizer``'s, group by group and parameter by
    parameter: the Trainer builds its optimizer from the model's parameters in the same order
    under every strategy. Names are the model's state-dict keys, as DCP's full optimizer state
    dicts have them. Tensors are not copied.

    Args:
        saved: ``optimizer.state_dict()`` as a plain checkpoint holds it.
        model: The model whose parameters ``optimizer`` updates (wrapped or not).
        optimizer: The optimizer to load into.

    Returns:
        ``{"state": {name: {...}}, "param_groups": [{..., "params": [name, ...]}]}``.

    Raises:
        CheckpointError: If ``saved`` is no optimizer state, its groups do not match
            ``optimizer``'s, or ``optimizer`` updates a tensor that is not ``model``'s.
    """
    whole: Mapping[str, Any] = saved if isinstance(saved, Mapping) else {}
    groups = whole.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, Mapping) for g in groups):
        raise CheckpointError("it holds no optimizer state ('optimizer_state')")
    sizes = [len(g.get("params", ())) for g in groups]
    wanted = [len(g["params"]) for g in optimizer.param_groups]
    if sizes != wanted:
        raise CheckpointError(
            f"its optimizer has param groups of {sizes} parameters and this run's of {wanted}: "
            "resume with the optimizer it was written with"
        )
    names = {id(p): parameter_name(name) for name, p in unwrap_model(model).named_parameters()}
    by_index = whole.get("state") or {}
    state: dict[str, Any] = {}
    named_groups = []
    for group, target in zip(groups, optimizer.param_groups, strict=True):
        if any(id(p) not in names for p in target["params"]):
            raise CheckpointError(
                "the optimizer holds tensors that are not the model's parameters: create it "
                "after fully_shard(), from model.parameters()"
            )
        fqns = [names[id(p)] for p in target["params"]]
        pairs = zip(group["params"], fqns, strict=True)
        state.update({fqn: by_index[i] for i, fqn in pairs if i in by_index})
        named_groups.append({**group, "params": fqns})
    return {"state": state, "param_groups": named_groups}


def _model_state(state: Mapping[str, Any], model: nn.Module) -> dict[str, Any]:
    """The saved weights, checked against ``model``'s names and (global) shapes."""
    saved = state.get("model_state")
    if not isinstance(saved, Mapping):
        raise CheckpointError("it holds no model state ('model_state')")
    saved = strip_wrapper_prefixes(saved)
    wanted = strip_wrapper_prefixes(unwrap_model(model).state_dict())  # DTensors: global shapes
    differ = [k for k in wanted if k in saved and tuple(saved[k].shape) != tuple(wanted[k].shape)]
    missing = [k for k in wanted if k not in saved]
    unexpected = [k for k in saved if k not in wanted]
    if differ or missing or unexpected:
        k = (differ or missing or unexpected)[0]
        there = list(saved[k].shape) if k in saved else "missing"
        here = list(wanted[k].shape) if k in wanted else "missing"
        raise CheckpointError(
            f"it was written by a model of another shape: '{k}' is {there} there and {here} "
            "in this job; use the task options it was written with"
        )
    return dict(saved)
