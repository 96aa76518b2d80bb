"""The default losses of user tasks: cross-entropy as a mean, and as a (sum, count) pair.

``cross_entropy_sum`` is what the Trainer trains user tasks with: positions whose target is
:data:`IGNORE_INDEX` (padding, prompt tokens) are not scored, and the sum is divided by the
scored targets of the whole global batch (:mod:`gpu_training.step`). Both accept a model
output with ``logits`` (a Hugging Face ``ModelOutput``, a dict) as well as a tensor.

Example:
    >>> import torch
    >>> round(cross_entropy_loss(torch.zeros(2, 5, 4), torch.zeros(2, 5).long()).item(), 4)
    1.3863
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.nn.functional as F
from torch import Tensor

__all__ = ["IGNORE_INDEX", "count_scored", "cross_entropy_loss", "cross_entropy_sum"]


def _a_type(obj: object) -> str:
    kind = type(obj).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


IGNORE_INDEX = -100
"""The target value that marks a position as not scored (PyTorch's and Hugging Face's)."""


def cross_entropy_sum(outputs: Any, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Cross-entropy summed over the scored targets, and their number.

    The default training loss of user tasks: positions whose target is :data:`IGNORE_INDEX`
    (padding, prompt tokens) are not scored, and the Trainer divides the sum by the scored
    targets of the whole global batch. Shapes and model outputs as :func:`cross_entropy_loss`.

    Args:
        outputs: Logits, or a model output holding them as ``logits``.
        targets: Class ids, :data:`IGNORE_INDEX` where not scored.

    Returns:
        ``(sum, count)``: 0-d tensors (``count`` an integer tensor).

    Raises:
        TypeError: If ``outputs`` is neither a tensor nor holds a ``logits`` tensor.

    Example:
        >>> import torch
        >>> total, count = cross_entropy_sum(torch.zeros(1, 3, 4), torch.tensor([[1, 2, -100]]))
        >>> int(count), round(float(total / count), 4)
        (2, 1.3863)
    """
    logits = _logits(outputs, "cross_entropy_sum")
    if logits.dim() == 3:
        logits, targets = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
    total = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
    return total, count_scored(targets)


def count_scored(targets: Tensor) -> Tensor:
    """Targets that are scored (not :data:`IGNORE_INDEX`), as a 0-d integer tensor."""
    return (targets != IGNORE_INDEX).sum()


def cross_entropy_loss(outputs: Any, targets: Tensor) -> Tensor:
    """Mean cross-entropy, for classifiers and sequence models alike.

    3-D outputs are taken as a language model's ``(batch, time, classes)`` and flattened with
    their ``(batch, time)`` targets, so every position counts once; any other shape goes to
    :func:`torch.nn.functional.cross_entropy` as is (classes in dim 1: ``(N, C)`` with ``(N,)``,
    or ``(N, C, H, W)`` with ``(N, H, W)``). For regression or anything else, give a loss.

    A model output that is not a tensor — a Hugging Face ``ModelOutput``, any object or dict
    with a ``logits`` field — is scored by its logits against ``targets``. Its ``loss`` is not
    used: a model called without labels has none, and a causal LM's own loss shifts the labels
    again, while ``targets`` are already the next tokens.

    Args:
        outputs: Logits, or a model output holding them as ``logits``.
        targets: Class ids.

    Returns:
        A 0-d tensor, the mean over every scored position.

    Raises:
        TypeError: If ``outputs`` is neither a tensor nor holds a ``logits`` tensor.

    Example:
        >>> import torch
        >>> round(cross_entropy_loss(torch.zeros(2, 5, 4), torch.zeros(2, 5).long()).item(), 4)
        1.3863
        >>> output = {"logits": torch.zeros(2, 4)}  # or a Hugging Face ModelOutput
        >>> round(cross_entropy_loss(output, torch.zeros(2).long()).item(), 4)
        1.3863
    """
    logits = _logits(outputs, "cross_entropy_loss")
    if logits.dim() == 3:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
    return F.cross_entropy(logits, targets)


def _logits(outputs: Any, loss: str) -> Tensor:
    """The logits tensor of a model's output: a tensor, a mapping or an object with ``logits``."""
    if isinstance(outputs, Tensor):
        return outputs
    found = outputs.get("logits") if isinstance(outputs, Mapping) else None  # a dict
    logits = found if found is not None else getattr(outputs, "logits", None)  # a ModelOutput
    if not isinstance(logits, Tensor):
        raise TypeError(
            f"{loss}: the model returned {_a_type(outputs)} with no logits tensor: return "
            "logits (or an object with .logits), or pass a loss "
            "(task.loss, --loss pkg.mod:fn(outputs, targets))"
        )
    return logits
