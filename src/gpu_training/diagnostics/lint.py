"""``gpu-training lint``: find the classic distributed-training mistakes without running a script.

An AST checker with one rule per pitfall of the guides (``GT001`` DataParallel … ``GT015`` no
``destroy_process_group``; :data:`~gpu_training.diagnostics.lint_rules.RULES` lists them and
``gpu-training lint --explain GT007`` tells why each one is a bug). It follows names through
assignments and ``with`` blocks (``model = DDP(model)`` … ``torch.save(model.state_dict())``),
understands rank guards (``if rank == 0``, ``if ctx.is_main_process``,
``if dist.get_rank() == 0``, an early ``return`` on the other ranks) and treats the toolkit's
helpers as the right way (``CheckpointManager.save`` is not an unguarded write, but it *is* a
barrier, so it must not sit under a rank guard).

Output is ``path:line:col: CODE message``; ``# noqa: GT003`` at the end of a line silences that
code there (a bare ``# noqa`` silences every code).

Example:
    >>> source = '''
    ... import torch
    ... import torch.distributed as dist
    ... from torch.nn.parallel import DistributedDataParallel as DDP
    ... dist.init_process_group("gloo")
    ... model = DDP(torch.nn.Linear(2, 2))
    ... torch.save(model.state_dict(), "model.pt")
    ... dist.destroy_process_group()
    ... '''
    >>> for finding in lint_source(source, "train.py"):
    ...     print(finding.format())
    train.py:7:1: GT007 every rank writes this file: guard it with a rank-0 check (save)
    train.py:7:12: GT006 saving the DDP wrapper's state_dict(): keys get a 'module.' prefix
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import tokenize
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from gpu_training.diagnostics.lint_checks import check_tree
from gpu_training.diagnostics.lint_rules import RULES, explain

__all__ = [
    "Finding",
    "LintError",
    "collect_files",
    "explain",
    "format_json",
    "format_text",
    "lint_paths",
    "lint_source",
    "select_rules",
]

_PY_SUFFIXES = (".py", ".pyw", ".pyi")
_SKIP_DIRS = frozenset({"__pycache__", "node_modules", "site-packages"})
_NOQA = re.compile(r"#\s*noqa(?P<colon>:\s*(?P<codes>[A-Za-z]+\d+(?:[\s,]+[A-Za-z]+\d+)*))?", re.I)


class LintError(ValueError):
    """Bad input for the linter: a missing path, a file that is not Python, a syntax error,
    an unknown rule code. The message is one line naming the file or code."""


@dataclass(frozen=True, order=True)
class Finding:
    """One problem in one file.

    Attributes:
        path: The file, as given (or found under a given directory).
        line: 1-based line.
        col: 1-based column.
        code: The rule code (``GT007``).
        message: The rule's one-line message.
        detail: What exactly was found (``torch.save``, ``'cuda:0' is the same GPU...``).
    """

    path: str
    line: int
    col: int
    code: str
    message: str
    detail: str = ""

    def format(self) -> str:
        """``path:line:col: CODE message (detail)``."""
        suffix = f" ({self.detail})" if self.detail else ""
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}{suffix}"


def select_rules(
    select: Iterable[str] | None = None, ignore: Iterable[str] | None = None
) -> frozenset[str]:
    """The rule codes to report: ``select`` (default all) minus ``ignore``.

    Each entry is a code (``GT003``), a prefix (``GT00``) or ``ALL``; case does not matter.

    Args:
        select: Codes or prefixes to report (None: every rule).
        ignore: Codes or prefixes to leave out.

    Returns:
        The selected codes.

    Raises:
        LintError: On an entry that matches no rule.

    Example:
        >>> sorted(select_rules(["GT00"], ["gt001", "GT002"]))[:2]
        ['GT003', 'GT004']
    """

    def expand(entries: Iterable[str], flag: str) -> set[str]:
        codes: set[str] = set()
        for raw in entries:
            entry = raw.strip().upper()
            if not entry:
                continue
            matched = set(RULES) if entry == "ALL" else {c for c in RULES if c.startswith(entry)}
            if not matched:
                raise LintError(
                    f"{flag}: unknown rule code {raw.strip()!r}: codes are "
                    f"{min(RULES)}..{max(RULES)} (see --list-rules)"
                )
            codes |= matched
        return codes

    chosen = set(RULES) if select is None else expand(select, "--select")
    if ignore is not None:
        chosen -= expand(ignore, "--ignore")
    return frozenset(chosen)


def _noqa_lines(source: str) -> dict[int, frozenset[str] | None]:
    """Line → codes silenced by a ``# noqa`` comment there (None: every code)."""
    found: dict[int, frozenset[str] | None] = {}
    if "noqa" not in source.lower():
        return found
    try:
        tokens = [
            (tok.start[0], tok.string)
            for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT
        ]
    except (tokenize.TokenError, SyntaxError):
        tokens = [(n, line) for n, line in enumerate(source.splitlines(), 1) if "#" in line]
    for line, comment in tokens:
        match = _NOQA.search(comment)
        if match is None:
            continue
        codes = match.group("codes")
        found[line] = None if codes is None else frozenset(re.findall(r"\w+", codes.upper()))
    return found


def _parse(source: str, path: str) -> ast.Module:
    try:
        return ast.parse(source, filename=path)
    except SyntaxError as err:
        where = f"{path}:{err.lineno or 0}:{err.offset or 0}"
        raise LintError(
            f"{where}: syntax error: {err.msg} (lint reads valid Python only)"
        ) from None
    except ValueError as err:  # e.g. "source code string cannot contain null bytes"
        raise LintError(f"{path}: not a Python source file ({err})") from None
    except RecursionError:
        raise LintError(f"{path}: nested too deeply for the Python parser") from None


def _check(tree: ast.Module, source: str, path: str, codes: frozenset[str]) -> list[Finding]:
    noqa = _noqa_lines(source)
    findings = []
    for raw in check_tree(tree):
        if raw.code not in codes:
            continue
        silenced = noqa.get(raw.line, frozenset())
        if silenced is None or raw.code in silenced:
            continue
        message = RULES[raw.code].message
        findings.append(Finding(path, raw.line, raw.col + 1, raw.code, message, raw.detail))
    return findings


def lint_source(
    source: str,
    path: str = "<string>",
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
) -> list[Finding]:
    """Lint Python source text.

    Args:
        source: The code.
        path: The name to report findings under.
        select: Rule codes or prefixes to report (default all); see :func:`select_rules`.
        ignore: Rule codes or prefixes to leave out.

    Returns:
        The findings, sorted by line, column and code.

    Raises:
        LintError: If the source is not valid Python or a code is unknown.

    Example:
        >>> [f.code for f in lint_source("import torch\\nm = torch.nn.DataParallel(m)\\n")]
        ['GT001']
        >>> lint_source("m = torch.nn.DataParallel(m)  # noqa: GT001\\n")
        []
    """
    codes = select_rules(select, ignore)
    return sorted(_check(_parse(source, path), source, path, codes))


def collect_files(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The Python files ``paths`` name: files as given, directories searched for ``*.py``.

    Hidden directories (``.venv``, ``.git``) and ``__pycache__`` are skipped.

    Args:
        paths: Files and directories.

    Returns:
        Files, in the order given (each directory's files sorted), without duplicates.

    Raises:
        LintError: If a path does not exist, or a file given by name is not Python (no
            ``.py`` suffix and no ``python`` shebang).
    """
    if not paths:
        raise LintError("no PATH given: name Python files or directories to lint")
    found: dict[Path, None] = {}
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise LintError(f"{raw}: no such file or directory")
        if path.is_dir():
            for file in sorted(path.rglob("*")):
                rel = file.relative_to(path).parts
                if any(p.startswith(".") or p in _SKIP_DIRS for p in rel[:-1]):
                    continue
                if file.suffix in _PY_SUFFIXES and file.is_file():
                    found[file] = None
            continue
        if path.suffix not in _PY_SUFFIXES and not _has_python_shebang(path):
            raise LintError(
                f"{raw}: not a Python file (expected a .py file or a directory to search)"
            )
        found[path] = None
    return list(found)


def _has_python_shebang(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            first = handle.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _read(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as err:
        raise LintError(f"{path}: cannot read: {err.strerror or err}") from None
    if b"\0" in data:
        raise LintError(f"{path}: not a Python source file (binary content)")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError) as err:
        raise LintError(f"{path}: not a Python source file (cannot decode it: {err})") from None


def lint_paths(
    paths: Sequence[str | os.PathLike[str]],
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
) -> tuple[list[Finding], int]:
    """Lint files and directories. Every file is read and parsed before any is checked, so
    bad input fails before anything is reported.

    Args:
        paths: Files and directories (see :func:`collect_files`).
        select: Rule codes or prefixes to report (default all).
        ignore: Rule codes or prefixes to leave out.

    Returns:
        ``(findings, number of files checked)``.

    Raises:
        LintError: On a missing path, a non-Python file, a syntax error or an unknown code;
            the message names the file (and line) or the code.
    """
    codes = select_rules(select, ignore)
    parsed = []
    for file in collect_files(paths):
        source = _read(file)
        parsed.append((_parse(source, str(file)), source, str(file)))
    findings: list[Finding] = []
    for tree, source, name in parsed:
        findings += _check(tree, source, name, codes)
    return sorted(findings), len(parsed)


def format_text(findings: Sequence[Finding], files: int) -> str:
    """One line per finding, then a summary line.

    Example:
        >>> print(format_text([], 3))
        No problems found in 3 files.
    """
    if not findings:
        return f"No problems found in {files} file{'s' * (files != 1)}."
    counts = Counter(f.code for f in findings)
    per_code = ", ".join(f"{c} x{n}" if n > 1 else c for c, n in sorted(counts.items()))
    touched = len({f.path for f in findings})
    noun = "problem" if len(findings) == 1 else "problems"
    summary = f"Found {len(findings)} {noun} in {touched} of {files} files ({per_code})."
    hint = "Run 'gpu-training lint --explain CODE' for why and how to fix."
    return "\n".join([*(f.format() for f in findings), summary, hint])


def format_json(findings: Sequence[Finding]) -> str:
    """The findings as a JSON list of objects (path, line, col, code, message, detail, fix)."""
    rows = [{**asdict(f), "fix": RULES[f.code].fix} for f in findings]
    return json.dumps(rows, indent=2)
