"""Data loaders a library builds around a ``DistributedSampler`` (``GT005``).

timm's ``create_loader(dataset, ..., is_training=True, distributed=...)`` builds a shuffling
``DistributedSampler`` when ``distributed`` is true (an ordered one for evaluation), and with
``use_prefetcher`` (its default) returns a ``PrefetchLoader`` around the ``DataLoader``. The
sampler needs ``loader.sampler.set_epoch(epoch)`` as any other; and an Accelerate
``prepare()`` re-wraps only ``torch.utils.data.DataLoader`` instances, so a ``PrefetchLoader``
comes back as it went in, with no reseeding of its own.

DeepSpeed likewise: ``deepspeed.initialize(..., training_data=dataset)`` (and an engine's
``deepspeed_io(dataset)``) returns a ``DeepSpeedDataLoader`` over a ``DistributedSampler`` it
builds with the default ``shuffle=True``; its ``__iter__`` builds a fresh ``DataLoader`` over
that same sampler and never advances the epoch, so the order repeats unless the script calls
``loader.data_sampler.set_epoch(epoch)``.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import Imports
    >>> tree = ast.parse("import timm\\ntimm.data.create_loader(ds, is_training=True, distributed=d)")
    >>> call = tree.body[1].value
    >>> shuffling_library_loader(call, Imports(tree)), prefetched_loader(call, Imports(tree))
    (True, True)
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import call_arg, keyword_arg
from gpu_training.diagnostics.lint.model import Imports, call_name

__all__ = ["prefetched_loader", "shuffling_library_loader"]


def _timm_loader(call: ast.Call, imports: Imports) -> bool:
    name = call_name(call, imports)
    return name.startswith("timm.") and name.endswith(".create_loader")


def _false(expr: ast.expr | None) -> bool:
    return isinstance(expr, ast.Constant) and not expr.value


def _deepspeed_loader(call: ast.Call, imports: Imports) -> bool:
    """``deepspeed.initialize(..., training_data=<not None>)``, ``engine.deepspeed_io(ds)``."""
    name = call_name(call, imports)
    if name.split(".")[-1] == "deepspeed_io":
        return bool(call.args) or keyword_arg(call, "dataset") is not None
    if not (name.startswith("deepspeed") and name.endswith(".initialize")):
        return False
    data = call_arg(call, 4, "training_data")  # initialize(args, model, opt, params, data)
    return data is not None and not (isinstance(data, ast.Constant) and data.value is None)


def shuffling_library_loader(call: ast.Call, imports: Imports) -> bool:
    """``timm.data.create_loader(..., is_training=True, distributed=<not False>)``, or a
    DeepSpeed loader (:func:`_deepspeed_loader`): a loader over a shuffling
    ``DistributedSampler``."""
    if _deepspeed_loader(call, imports):
        return True
    if not _timm_loader(call, imports):
        return False
    training = keyword_arg(call, "is_training")
    distributed = keyword_arg(call, "distributed")
    return (
        isinstance(training, ast.Constant)
        and training.value is True
        and distributed is not None
        and not _false(distributed)
    )


def prefetched_loader(call: ast.Call, imports: Imports) -> bool:
    """A timm loader that may come back as a ``PrefetchLoader`` (``use_prefetcher`` not given
    or not ``False``): not a ``DataLoader``, so Accelerate leaves it and its sampler alone."""
    return _timm_loader(call, imports) and not _false(keyword_arg(call, "use_prefetcher"))
