"""A name or attribute that nothing in the module reads (``GT002``).

``self.device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")`` places
nothing on ``cuda:0`` when no line reads ``self.device``: the modules and batches go wherever
the rest of the code sends them. A fixed device that is built and dropped is not every rank's
GPU choice, so ``GT002``'s literal ``cuda:N`` check skips it (the bare ``.cuda()`` calls of
the same file are judged on their own).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> facts = ModuleFacts(ast.parse("self.device = d\\nx = 1\\nprint(x)\\n"))
    >>> never_read(facts, "self.device"), never_read(facts, "x")
    (True, False)
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import ModuleFacts, dotted

__all__ = ["never_read"]


def never_read(facts: ModuleFacts, key: str) -> bool:
    """No node of the module loads ``key`` (``"device"``, ``"self.device"``); a ``getattr``
    or anything dynamic is not looked for."""
    return not any(
        isinstance(node, (ast.Name, ast.Attribute))
        and isinstance(node.ctx, ast.Load)
        and dotted(node) == key
        for node in facts.nodes
    )
