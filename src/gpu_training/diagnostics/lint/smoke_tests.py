"""A model file's ``__main__`` smoke test: a ``DataParallel`` there trains nothing (``GT001``).

A model definition file often ends with ``if __name__ == "__main__":`` that builds the
network, wraps it in ``nn.DataParallel``, runs one forward on a random tensor and prints
the output shapes (or a parameter summary). Nothing there has gradients to reduce: the file
runs no training step (no ``backward``/``zero_grad``, itself or through a helper of the
project) and builds no optimizer, and the block is not imported by the training scripts.
``DataParallel``'s cost is a training cost (one process, a gradient gather per step), so a
wrapper in such a block is not reported; one in a file that trains, or builds an optimizer
(a step may hide in a library call), still is.

Example:
    >>> import ast
    >>> src = ("class Net: ...\\nif __name__ == '__main__':\\n"
    ...        "    net = nn.DataParallel(Net())\\n    print(net(x).shape)\\n")
    >>> tree = ast.parse(src)
    >>> call = tree.body[1].body[0].value
    >>> main_block_smoke_test(tree, call, trains=False)
    True
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import is_main_block
from gpu_training.diagnostics.lint.model import dotted

__all__ = ["main_block_smoke_test"]

_OPTIMIZERS = ("optim", "optimizer", "sgd", "adam", "lamb", "lars", "lion", "adafactor")


def main_block_smoke_test(tree: ast.Module, call: ast.Call, *, trains: bool) -> bool:
    """Whether a call sits in the module's ``__main__`` block of a file that never trains.

    Args:
        tree: The module.
        call: The ``DataParallel(...)`` call.
        trains: The file (or a helper it calls) runs a training step.

    Returns:
        True when the call is inside a top-level ``if __name__ == "__main__":`` and the file
        has no training step and builds no optimizer.
    """
    if trains:
        return False
    blocks = [node for node in tree.body if is_main_block(node)]
    if not any(call in ast.walk(block) for block in blocks):
        return False
    return not any(
        isinstance(node, ast.Call) and _builds_optimizer(node) for node in ast.walk(tree)
    )


def _builds_optimizer(call: ast.Call) -> bool:
    """``torch.optim.AdamW(...)``, ``SGD(...)``, ``create_optimizer(...)``, ``step()``."""
    name = (dotted(call.func) or "").lower()
    last = name.rsplit(".", 1)[-1]
    return last == "step" or any(word in name for word in _OPTIMIZERS)
