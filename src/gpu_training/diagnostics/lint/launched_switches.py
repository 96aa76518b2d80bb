"""A branch every shipped launch switches off (its findings are code no run reaches).

A training script often carries two paths behind a switch, ``if args.use_lora: ... else:
...``, and the repository's run scripts all take one of them (``accelerate launch train.py
... --use_lora``). The other path runs in none of the runs the repository ships: what it
would do is no bug of those runs (the convention of the evaluation sets, issue 33), as for
code nothing calls. A switch here is an ``argparse`` flag with ``action="store_true"``; when
every shell-script line that runs the file (comments aside) passes it, the ``else`` of ``if
args.<flag>:`` and the body of ``if not args.<flag>:`` never run. A file no script runs, or
a flag one launch leaves out, keeps every branch.

Example:
    >>> import ast, tempfile
    >>> from pathlib import Path
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / ".git").mkdir()
    >>> _ = (root / "run.sh").write_text("accelerate launch train.py \\\\\\n  --use_lora\\n")
    >>> src = ("p.add_argument('--use_lora', action='store_true')\\n"
    ...        "if args.use_lora:\\n    a = 1\\nelse:\\n    b = 2\\n")
    >>> launched_switch_spans(ModuleFacts(ast.parse(src), str(root / "train.py")))
    [(5, 5)]
"""

from __future__ import annotations

import ast
import os
import re

from gpu_training.diagnostics.lint.calls import keyword_arg
from gpu_training.diagnostics.lint.launched_flags import spelled_flag
from gpu_training.diagnostics.lint.model import ModuleFacts
from gpu_training.diagnostics.lint.passed_paths import option_name
from gpu_training.diagnostics.lint.plain_launches import shipped_runs_only
from gpu_training.diagnostics.lint.repo_files import repository_of, text_files

__all__ = ["launched_switch_spans"]


def launched_switch_spans(facts: ModuleFacts) -> list[tuple[int, int]]:
    """The line spans of the file's branches that every shipped launch switches off.

    Args:
        facts: The module (its path finds the repository and the scripts that run it).

    Returns:
        ``(first line, last line)`` of each such branch.
    """
    if facts.path in ("", "<string>") or not shipped_runs_only(facts):
        return []
    switches = _store_true_flags(facts)
    if not switches:
        return []
    launches = _launch_lines(repository_of(os.path.abspath(facts.path)), facts.path)
    if not launches:
        return []
    always = {f for f in switches if all(_passes(line, f) for line in launches)}
    spans: list[tuple[int, int]] = []
    for node in facts.nodes:
        if not isinstance(node, ast.If):
            continue
        test, negated = node.test, False
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test, negated = test.operand, True
        if not (isinstance(test, ast.Attribute) and test.attr in always):
            continue
        dead = node.body if negated else node.orelse
        if dead:
            spans.append((dead[0].lineno, dead[-1].end_lineno or dead[-1].lineno))
    return spans


def _store_true_flags(facts: ModuleFacts) -> set[str]:
    """The names the file's ``add_argument("--x", action="store_true")`` options store as."""
    found: set[str] = set()
    for node in facts.nodes:
        if isinstance(node, ast.Call) and (name := option_name(node)) is not None:
            action = keyword_arg(node, "action")
            if isinstance(action, ast.Constant) and action.value == "store_true":
                found.add(name)
    return found


def _launch_lines(root: str, path: str) -> list[str]:
    """Each command line of the repository's shell scripts that runs the file (a line
    continued with ``\\`` read as one; comments left out)."""
    script = re.compile(rf"(?:^|[\s/=]){re.escape(os.path.basename(path))}(?:\s|$)")
    lines: list[str] = []
    for _, text in text_files(root, (".sh", ".bash")):
        for line in text.replace("\\\n", " ").splitlines():
            if not line.lstrip().startswith("#") and script.search(line):
                lines.append(line)
    return lines


def _passes(line: str, flag: str) -> bool:
    return re.search(rf"--{spelled_flag(flag)}(?:\s|$)", line) is not None
