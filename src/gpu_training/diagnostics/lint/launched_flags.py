"""Accumulation whose count every shipped launch sets to 1 (``GT013`` does not arise).

``GT013`` is about accumulation windows of several micro-batches. A loop that steps under
``if (i + 1) % args.gradient_accumulation_steps == 0:`` accumulates only when that flag is
above 1. When every shell script of the repository that runs the file passes the flag, and
passes it as ``1`` (``--gradient_accumulation_steps 1``), the runs the repository ships step
on every micro-batch: there is nothing for ``no_sync()`` to save. A script that passes any
other value, or no script that passes the flag at all, keeps the finding.

Example:
    >>> import ast, tempfile
    >>> from pathlib import Path
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / ".git").mkdir()
    >>> _ = (root / "run.sh").write_text("accelerate launch train.py --grad_accum 1\\n")
    >>> src = ("for i, b in enumerate(dl):\\n    if (i + 1) % args.grad_accum == 0:\\n"
    ...        "        optimizer.step()\\n")
    >>> facts = ModuleFacts(ast.parse(src), str(root / "train.py"))
    >>> launched_without_accumulation(facts, facts.tree.body[0])
    True
"""

from __future__ import annotations

import ast
import os
import re

from gpu_training.diagnostics.lint.model import ModuleFacts, iter_scope_nodes
from gpu_training.diagnostics.lint.repo_files import repository_of, text_files

__all__ = ["launched_without_accumulation"]


def launched_without_accumulation(facts: ModuleFacts, loop: ast.stmt) -> bool:
    """Whether every modulo count of the loop's tests is a flag that every shipped script
    running this file sets to ``1``.

    Args:
        facts: The module (its path finds the repository and the scripts that run it).
        loop: The accumulation loop.

    Returns:
        True when the loop's ``x % args.<flag>`` counts are all flags, and each is passed,
        as ``1`` only, by at least one shell script that names this file.
    """
    if facts.path in ("", "<string>"):
        return False
    flags: set[str] = set()
    for node in iter_scope_nodes(getattr(loop, "body", [])):
        if not isinstance(node, ast.If) or not _steps(node):
            continue  # a test that does not step the optimizer: a checkpoint, a log
        for sub in ast.walk(node.test):
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mod):
                if not isinstance(sub.right, ast.Attribute):
                    return False  # a count that is not a flag
                flags.add(sub.right.attr)
    if not flags:
        return False
    script = os.path.basename(facts.path)
    texts = [
        text.replace("\\\n", " ")
        for _, text in text_files(repository_of(os.path.abspath(facts.path)), (".sh", ".bash"))
        if script in text
    ]
    return all(_always_one(texts, flag) for flag in flags)


def _always_one(texts: list[str], flag: str) -> bool:
    spelled = "[-_]".join(re.escape(part) for part in flag.split("_"))
    pattern = re.compile(rf"--{spelled}(?:=|\s+)(\S+)")
    values = [m.group(1).strip("\"'") for text in texts for m in pattern.finditer(text)]
    return bool(values) and all(v == "1" for v in values)


def _steps(test: ast.If) -> bool:
    """The branch steps an optimizer (``optimizer.step()``) or clears its gradients."""
    for node in iter_scope_nodes(test.body):
        func = node.func if isinstance(node, ast.Call) else None
        if not isinstance(func, ast.Attribute):
            continue
        if func.attr == "zero_grad" or (
            func.attr == "step" and "optim" in ast.unparse(func.value).lower()
        ):
            return True
    return False
