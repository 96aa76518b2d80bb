"""State-dict keys without the prefixes wrappers add (``module.``, ``_orig_mod.``...)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, cast

__all__ = ["CHECKPOINT_WRAPPER", "WRAPPER_PREFIXES", "parameter_name", "strip_wrapper_prefixes"]

WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_forward_module.")
"""Key prefixes added by DDP/DataParallel/FSDP1/DeepSpeed, ``torch.compile`` and Fabric."""

CHECKPOINT_WRAPPER = "_checkpoint_wrapped_module."
"""What activation checkpointing puts in parameter names (state-dict keys drop it)."""


def parameter_name(name: str) -> str:
    """A parameter's name as state dicts key it: no activation-checkpointing wrapper in it.

    ``named_parameters()`` of a model with checkpointed blocks says
    ``blocks.0._checkpoint_wrapped_module.attn.weight``; its ``state_dict()`` says
    ``blocks.0.attn.weight``. Checkpoints of every format use the latter.

    Example:
        >>> parameter_name("blocks.0._checkpoint_wrapped_module.attn.weight")
        'blocks.0.attn.weight'
    """
    return name.replace(CHECKPOINT_WRAPPER, "")


# ----------------------------------------------------------------------------------------------
# key normalisation


def _strip_keys(mapping: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """Strips wrapper prefixes shared by *every* key; returns the new dict and what was cut."""
    keys = list(mapping)
    cut = ""
    while keys and all(isinstance(k, str) for k in keys):
        prefix = next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in keys)), None)
        if prefix is None:
            break
        keys = [k[len(prefix) :] for k in keys]
        cut += prefix
    return dict(zip(keys, mapping.values(), strict=True)), cut


def _strip(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        stripped, cut = _strip_keys(obj)
        values = {k: _strip(v) for k, v in stripped.items()}
        if not isinstance(obj, OrderedDict):
            return values
        out: OrderedDict[Any, Any] = OrderedDict(values)
        meta = getattr(obj, "_metadata", None)
        if isinstance(meta, Mapping):
            # module versions live in _metadata keyed by module path: "module.0" -> "0"
            new_meta = OrderedDict(
                (f"{k}."[len(cut) :].rstrip("."), v)
                for k, v in meta.items()
                if isinstance(k, str) and f"{k}.".startswith(cut)
            )
            out._metadata = new_meta  # type: ignore[attr-defined]
        return out
    if type(obj) is list:
        return [_strip(v) for v in obj]
    if type(obj) is tuple:
        return tuple(_strip(v) for v in obj)
    return obj


def strip_wrapper_prefixes(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Removes ``module.`` / ``_orig_mod.`` / ``_forward_module.`` prefixes, at any depth.

    Every mapping in ``state_dict`` (itself included, and those inside lists and tuples) whose
    keys *all* start with one wrapper prefix loses it, repeatedly, so ``module._orig_mod.w``
    (DDP around a compiled model) becomes ``w``. A mapping where only some keys carry the prefix
    is left alone: that is a model with a submodule really named ``module``. Tensors are not
    copied; ``OrderedDict`` and its ``_metadata`` (module versions) are kept.

    Args:
        state_dict: A state dict, or a dict of them (``{"model_state": ..., "epoch": 3}``).

    Returns:
        A new dict with the same values under the stripped keys.

    Example:
        >>> strip_wrapper_prefixes({"module.fc.weight": 1, "module.fc.bias": 2})
        {'fc.weight': 1, 'fc.bias': 2}
    """
    return cast(dict[str, Any], _strip(state_dict))
