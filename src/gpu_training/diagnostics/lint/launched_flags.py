"""Accumulation whose count every shipped launch sets to 1 (``GT013`` does not arise).

``GT013`` is about accumulation windows of several micro-batches. A loop that steps under
``if (i + 1) % args.gradient_accumulation_steps == 0:`` accumulates only when that flag is
above 1. When every shell script of the repository that runs the file passes the flag, and
passes it as ``1`` (``--gradient_accumulation_steps 1``), the runs the repository ships step
on every micro-batch: there is nothing for ``no_sync()`` to save. So do they when the file
declares the flag with the default ``1`` (``grad_accumulation_steps: int = 1`` in its config
class) and no script, document or config of the repository names it. A script that passes any
other value, a default above 1 that no script overrides, or a flag a README mentions keeps the
finding.

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
from gpu_training.diagnostics.lint.passed_paths import option_default
from gpu_training.diagnostics.lint.plain_launches import shipped_runs_only
from gpu_training.diagnostics.lint.repo_files import repository_of, text_files

__all__ = ["launched_without_accumulation", "spelled_flag"]


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
    if facts.path in ("", "<string>") or not shipped_runs_only(facts):
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
    root = repository_of(os.path.abspath(facts.path))
    texts = [
        text.replace("\\\n", " ")
        for _, text in text_files(root, (".sh", ".bash"))
        if script in text
    ]
    return all(
        _always_one(texts, flag) or (_default_one(facts, flag) and not _mentioned(root, flag))
        for flag in flags
    )


def _default_one(facts: ModuleFacts, flag: str) -> bool:
    """The file declares the flag with the default ``1``: ``add_argument("--flag", ...,
    default=1)`` or a config class's field ``flag: int = 1``, with no other default and no
    ``args.flag = ...`` (a sweep that sets it)."""
    option = option_default(facts, flag)  # an ast node other than a literal: not 1
    defaults: list[object] = []
    if option is not None:
        defaults.append(option.value if isinstance(option, ast.Constant) else option)
    for node in facts.nodes:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == flag for t in node.targets
        ):
            return False  # `args.flag = wandb.config.flag`: set by the run, not the default
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == flag
            and isinstance(node.value, ast.Constant)
        ):
            defaults.append(node.value.value)  # a config class's `flag: int = 1`
    return bool(defaults) and all(d == 1 and d is not True for d in defaults)


def _mentioned(root: str, flag: str) -> bool:
    """Any script, document or config of the repository names the flag (a run may set it)."""
    spelled = re.compile(spelled_flag(flag))
    suffixes = (".sh", ".bash", ".md", ".rst", ".txt", ".yaml", ".yml", ".json", ".toml", ".cfg")
    return any(spelled.search(text) for _, text in text_files(root, suffixes))


def _always_one(texts: list[str], flag: str) -> bool:
    spelled = spelled_flag(flag)
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


def spelled_flag(flag: str) -> str:
    """A regular expression for a flag's name as a command line writes it: ``grad_accum``
    matches ``grad_accum`` and ``grad-accum``."""
    return "[-_]".join(re.escape(part) for part in flag.split("_"))
