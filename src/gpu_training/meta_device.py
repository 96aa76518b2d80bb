"""Build a model on the ``meta`` device for its shape alone, without torch's slow first init.

``with torch.device("meta"): model = build()`` runs the model's initialisation on tensors
that have no data. Most of it is free, but a few in-place ops (``normal_``, ``erfinv_``,
``clamp_``, ``exponential_``) have no meta kernel of their own: torch runs their Python
reference, which imports ``torch._dynamo`` and sympy the first time (the cost is in
benchmarks/README.md, ``bench_startup.py --jobs``), in every process that checks a job before
it starts (``train``, ``launch``, ``plan``, ``find-batch``). On ``meta`` these ops change no
shape, dtype or stride, so :func:`meta_device` skips them: the module built is the same.

Example:
    >>> import torch
    >>> with meta_device():
    ...     layer = torch.nn.Embedding(50304, 768)  # its init is a normal_
    >>> layer.weight.device.type, tuple(layer.weight.shape)
    ('meta', (50304, 768))
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["VALUE_ONLY_OPS", "meta_device"]

VALUE_ONLY_OPS: frozenset[str] = frozenset(
    {
        "normal_",
        "uniform_",
        "exponential_",
        "log_normal_",
        "cauchy_",
        "geometric_",
        "random_",
        "bernoulli_",
        "erfinv_",
        "clamp_",
        "clamp_min_",
        "clamp_max_",
    }
)
"""In-place tensor ops that change a tensor's values only (not its shape, dtype or strides):
on a ``meta`` tensor, which has no values, they are skipped, as is every initialiser of
``torch.nn.init`` (each fills a tensor in place)."""


def _target(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """The tensor an op or initialiser works on: its first argument, positional or named."""
    return args[0] if args else kwargs.get("tensor", kwargs.get("self"))


class _SkipValueOps(TorchFunctionMode):
    """Returns a meta tensor unchanged from the ops in :data:`VALUE_ONLY_OPS`."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        target = _target(args, kwargs)
        if isinstance(target, torch.Tensor) and target.is_meta:
            is_init = getattr(func, "__module__", None) == "torch.nn.init"
            if is_init or getattr(func, "__name__", "") in VALUE_ONLY_OPS:
                return target
        return func(*args, **kwargs)


@contextlib.contextmanager
def meta_device() -> Iterator[None]:
    """``torch.device("meta")`` for building a model's structure: no memory, no values.

    Tensors created inside are on ``meta``, as with ``torch.device("meta")``; the in-place
    ops in :data:`VALUE_ONLY_OPS` applied to a meta tensor are skipped, as they change
    nothing a meta tensor has (see the module's docstring for why).

    Yields:
        Nothing; use as ``with meta_device(): model = build()``.
    """
    with torch.device("meta"), _SkipValueOps():
        yield
