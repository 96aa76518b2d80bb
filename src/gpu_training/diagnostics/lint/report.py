"""``gpu-training lint``: find the classic distributed-training mistakes without running a script.

An AST checker with one rule per pitfall of the guides (``GT001`` DataParallel … ``GT019``
bf16 parameters under torch.optim's AdamW; :data:`~gpu_training.diagnostics.lint.rules.RULES`
lists them and ``gpu-training lint --explain GT007`` tells why each one is a bug). It reads the whole
project: the files given, and the project's own modules they import (``utils.py`` beside
``main.py``), so a helper that creates the process group, replaces ``print`` on the other
ranks, returns a rank-0 test or builds the sampler is read for what it does. It follows names
through assignments and ``with`` blocks (``model = DDP(model)`` …
``torch.save(model.state_dict())``), recognises rank guards by what they compute
(``if rank == 0``, ``if utils.is_main_process()`` whose body compares the rank with 0, an
early ``return`` on the other ranks) and treats the toolkit's and the frameworks' helpers as
the right way (``CheckpointManager.save`` and ``accelerator.save`` are not unguarded writes).

Rules have a severity (:data:`~gpu_training.diagnostics.lint.rules.BUG` by default;
:data:`~gpu_training.diagnostics.lint.rules.HYGIENE` rules — printing from every rank, an LR
that is not scaled — only when asked), and each finding says what it rests on. A file that
cannot be read or parsed is one :class:`FileError` row; the other files are still linted.

Output is ``path:line:col: CODE message (evidence)``; ``# noqa: GT003`` at the end of a line
silences that code there (a bare ``# noqa`` silences every code).

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
    train.py:7:1: GT007 every rank writes this file: guard it with a rank-0 check (save runs on every rank: no rank-0 guard)
    train.py:7:12: GT006 saving the DDP wrapper's state_dict(): keys get a 'module.' prefix (model is the DDP wrapper)
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpu_training.diagnostics.lint.discover import (
    SKIP_DIRS,
    context_files,
    is_test_file,
    unresolved,
)
from gpu_training.diagnostics.lint.project import Project, find_project_root
from gpu_training.diagnostics.lint.roots import installed_packages
from gpu_training.diagnostics.lint.rules import BUG, HYGIENE, RULES, explain
from gpu_training.diagnostics.lint.run import RawFinding, check_project
from gpu_training.diagnostics.lint.vendored import vendored_package

__all__ = [
    "EXIT_FOUND",
    "EXIT_UNREADABLE",
    "FileError",
    "Finding",
    "LintError",
    "LintReport",
    "collect_files",
    "exit_code",
    "explain",
    "format_json",
    "format_text",
    "format_unresolved",
    "lint_paths",
    "lint_source",
    "select_rules",
]

EXIT_FOUND = 1
"""Exit status bit: something was found."""
EXIT_UNREADABLE = 4
"""Exit status bit: some file could not be read or parsed (the others were linted)."""

_PY_SUFFIXES = (".py", ".pyw", ".pyi")
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
    severity: str = BUG

    def format(self) -> str:
        """``path:line:col: CODE message (detail)``; hygiene findings say ``[hygiene]``."""
        suffix = f" ({self.detail})" if self.detail else ""
        label = " [hygiene]" if self.severity == HYGIENE else ""
        return f"{self.path}:{self.line}:{self.col}: {self.code}{label} {self.message}{suffix}"


@dataclass(frozen=True, order=True)
class FileError:
    """A file that could not be linted (unreadable, not text, a syntax error): one row.

    Attributes:
        path: The file.
        line: 1-based line of a syntax error (0 when it is not one).
        col: 1-based column (0 when unknown).
        message: What is wrong, in one line.
    """

    path: str
    line: int
    col: int
    message: str

    def format(self) -> str:
        """``path:line:col: ERROR message (file not linted)``."""
        return f"{self.path}:{self.line}:{self.col}: ERROR {self.message} (file not linted)"


@dataclass(frozen=True)
class LintReport:
    """What :func:`lint_paths` found.

    Attributes:
        findings: The findings, sorted by path, line, column and code.
        files: How many files were linted.
        errors: The files that could not be linted.
        unresolved: ``(file, module)``: imports of the project's own modules that could not
            be found (what their helpers do is unknown to the rules).
    """

    findings: list[Finding]
    files: int
    errors: list[FileError]
    unresolved: list[tuple[str, str]] = field(default_factory=list)


def select_rules(
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    *,
    hygiene: bool = False,
) -> frozenset[str]:
    """The rule codes to report: ``select`` (default: every bug rule) minus ``ignore``.

    Each entry is a code (``GT003``), a prefix (``GT00``) or ``ALL``; case does not matter.
    Hygiene rules (``GT008``, ``GT010``) are left out unless ``hygiene`` is set or ``select``
    names them (a code, a prefix or ``ALL``).

    Args:
        select: Codes or prefixes to report (None: every bug rule).
        ignore: Codes or prefixes to leave out.
        hygiene: Add the hygiene rules to the default selection.

    Returns:
        The selected codes.

    Raises:
        LintError: On an entry that matches no rule.

    Example:
        >>> sorted(select_rules(["GT00"], ["gt001", "GT002"]))[:2]
        ['GT003', 'GT004']
        >>> "GT008" in select_rules(), "GT008" in select_rules(hygiene=True)
        (False, True)
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

    if select is None:
        chosen = {c for c, rule in RULES.items() if hygiene or rule.severity != HYGIENE}
    else:
        chosen = expand(select, "--select")
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
        raise _Unparsable(err.lineno or 0, err.offset or 0, f"syntax error: {err.msg}") from None
    except ValueError as err:  # e.g. "source code string cannot contain null bytes"
        raise _Unparsable(0, 0, f"not a Python source file ({err})") from None
    except RecursionError:
        raise _Unparsable(0, 0, "nested too deeply for the Python parser") from None


class _Unparsable(Exception):
    def __init__(self, line: int, col: int, message: str) -> None:
        super().__init__(message)
        self.line, self.col, self.message = line, col, message


def _findings(
    raw: list[RawFinding],
    noqa: dict[int, frozenset[str] | None],
    path: str,
    codes: frozenset[str],
) -> list[Finding]:
    findings = []
    for found in raw:
        if found.code not in codes:
            continue
        silenced = noqa.get(found.line, frozenset())
        if silenced is None or found.code in silenced:
            continue
        rule = RULES[found.code]
        findings.append(
            Finding(
                path,
                found.line,
                found.col + 1,
                found.code,
                rule.message,
                found.detail,
                rule.severity,
            )
        )
    return findings


def lint_source(
    source: str,
    path: str = "<string>",
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    hygiene: bool = False,
) -> list[Finding]:
    """Lint Python source text: only ``source`` is reported on.

    Under a ``path`` on disk the modules it imports are read from beside it, as
    :func:`lint_paths` reads them (``from utils import setup`` makes ``setup()``'s process
    group the script's); under the default ``"<string>"`` nothing else is read.

    Args:
        source: The code.
        path: The name to report findings under, and where its imports are looked for.
        select: Rule codes or prefixes to report (default every bug rule); see
            :func:`select_rules`.
        ignore: Rule codes or prefixes to leave out.
        hygiene: Report the hygiene rules too.

    Returns:
        The findings, sorted by line, column and code.

    Raises:
        LintError: If the source is not valid Python or a code is unknown.

    Example:
        >>> [f.code for f in lint_source("import torch\\nm = torch.nn.DataParallel(m)\\n"
        ...                              "loss.backward()\\n")]
        ['GT001']
        >>> lint_source("m = torch.nn.DataParallel(m)  # noqa: GT001\\n")
        []
    """
    codes = select_rules(select, ignore, hygiene=hygiene)
    try:
        tree = _parse(source, path)
    except _Unparsable as err:
        where = f"{path}:{err.line}:{err.col}"
        raise LintError(f"{where}: {err.message} (lint reads valid Python only)") from None
    project = Project()
    project.add(path, tree)
    raw = check_project(project)[path]
    if isinstance(raw, str):
        raise LintError(f"{path}: {raw}")
    return sorted(_findings(raw, _noqa_lines(source), path, codes))


def collect_files(
    paths: Sequence[str | os.PathLike[str]], *, include_tests: bool = False
) -> list[Path]:
    """The Python files ``paths`` name: files as given, directories searched for ``*.py``.

    Hidden directories (``.venv``, ``.git``), ``__pycache__`` and directories of installed
    distributions (``pip install --target``: :func:`~gpu_training.diagnostics.lint.roots.installed_packages`)
    are skipped, and so, unless
    ``include_tests``, are test trees found under a directory (``tests/``, ``test/``,
    ``test_*.py``, ``*_test.py``, ``conftest.py``): unit tests run one process and check
    single-GPU code such as DataParallel on purpose. A file named on its own is always linted.

    Args:
        paths: Files and directories.
        include_tests: Lint the test trees under the directories too.

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
                if any(p.startswith(".") or p in SKIP_DIRS for p in rel[:-1]):
                    continue
                if any(_third_party(path.joinpath(*rel[:i])) for i in range(1, len(rel))):
                    continue
                if not include_tests and is_test_file(rel):
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


def _third_party(directory: Path) -> bool:
    """Installed distributions, or a copy of a library the repository depends on."""
    return installed_packages(directory) or vendored_package(directory)


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
        raise _Unparsable(0, 0, f"cannot read: {err.strerror or err}") from None
    if b"\0" in data:
        raise _Unparsable(0, 0, "not a Python source file (binary content)")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError) as err:
        raise _Unparsable(0, 0, f"not a Python source file (cannot decode it: {err})") from None


def lint_paths(
    paths: Sequence[str | os.PathLike[str]],
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    hygiene: bool = False,
    include_tests: bool = False,
    unshipped: bool = False,
) -> LintReport:
    """Lint files and directories as one project.

    The project's modules that the files import are read too (not reported), so helpers in
    another file count for what they do. A file that cannot be read or parsed becomes one
    :class:`FileError`; the others are linted.

    Args:
        paths: Files and directories (see :func:`collect_files`).
        select: Rule codes or prefixes to report (default every bug rule).
        ignore: Rule codes or prefixes to leave out.
        hygiene: Report the hygiene rules too.
        include_tests: Lint the test trees under the directories too (see
            :func:`collect_files`).
        unshipped: Report code that only a launch the repository does not ship reaches too
            (a script its run scripts start as one ``python`` process, the ``else`` of a
            ``store_true`` switch every run script passes); by default it reports nothing.

    Returns:
        The findings, the number of files linted and the files that could not be.

    Raises:
        LintError: On a missing path, a file named on the command line that is not Python,
            or an unknown code; the message names the path or the code.
    """
    codes = select_rules(select, ignore, hygiene=hygiene)
    files = collect_files(paths, include_tests=include_tests)
    roots = [Path(p) if Path(p).is_dir() else Path(p).parent for p in paths]
    repositories = sorted({r for p in paths if (r := find_project_root(p)) is not None})
    project = Project([*roots, *repositories])
    project.shipped_only = not unshipped
    noqa: dict[str, dict[int, frozenset[str] | None]] = {}  # not the texts: 71 MB on diffusers
    errors: list[FileError] = []
    for file in files:
        name = str(file)
        try:
            source = _read(file)
            project.add(name, _parse(source, name))
        except _Unparsable as err:
            errors.append(FileError(name, err.line, err.col, err.message))
            continue
        noqa[name] = _noqa_lines(source)
    # context: what imports the linted files or defines their base classes (not reported)
    context_files(project, repositories, roots, include_tests=include_tests)
    findings: list[Finding] = []
    for name, raw in check_project(project).items():
        if name not in noqa:
            continue
        if isinstance(raw, str):
            errors.append(FileError(name, 0, 0, raw))
            del noqa[name]
        else:
            findings += _findings(raw, noqa[name], name, codes)
    missing = sorted(
        (name, module) for name in noqa for module in unresolved(project, name, repositories)
    )
    return LintReport(sorted(findings), len(noqa), sorted(errors), missing)


def exit_code(report: LintReport) -> int:
    """The exit status of ``gpu-training lint``: :data:`EXIT_FOUND` (1) when something was
    found, plus :data:`EXIT_UNREADABLE` (4) when some file could not be linted; 0 when clean.

    Example:
        >>> exit_code(LintReport([], 3, [FileError("x.py", 2, 5, "syntax error")]))
        4
    """
    code = EXIT_FOUND if report.findings else 0
    return code | (EXIT_UNREADABLE if report.errors else 0)


def format_text(findings: Sequence[Finding], files: int, errors: Sequence[FileError] = ()) -> str:
    """One line per finding and per file that could not be linted, then a summary line.

    Example:
        >>> print(format_text([], 3))
        No problems found in 3 files.
        >>> print(format_text([], 2, [FileError("bad.py", 4, 7, "syntax error: invalid syntax")]))
        bad.py:4:7: ERROR syntax error: invalid syntax (file not linted)
        No problems found in 2 files; 1 file could not be linted.
    """
    unlinted = ""
    if errors:
        unlinted = f"; {len(errors)} file{'s' * (len(errors) != 1)} could not be linted"
    rows = [e.format() for e in errors]
    if not findings:
        return "\n".join(
            [*rows, f"No problems found in {files} file{'s' * (files != 1)}{unlinted}."]
        )
    counts = Counter(f.code for f in findings)
    per_code = ", ".join(f"{c} x{n}" if n > 1 else c for c, n in sorted(counts.items()))
    touched = len({f.path for f in findings})
    noun = "problem" if len(findings) == 1 else "problems"
    summary = f"Found {len(findings)} {noun} in {touched} of {files} files ({per_code}){unlinted}."
    hint = "Run 'gpu-training lint --explain CODE' for why and how to fix."
    return "\n".join([*(f.format() for f in findings), *rows, summary, hint])


def format_unresolved(unresolved: Sequence[tuple[str, str]], shown: int = 5) -> str:
    """The note on the project imports that could not be found: one line per file, the first
    ``shown`` files, then how many more.

    Example:
        >>> print(format_unresolved([("train.py", "utils.dist"), ("train.py", ".models")]))
        note: project imports not found (their helpers were not read): train.py: utils.dist, .models
    """
    per_file: dict[str, list[str]] = {}
    for path, module in unresolved:
        per_file.setdefault(path, []).append(module)
    head = "note: project imports not found (their helpers were not read): "
    lines = [f"{head}{path}: {', '.join(mods)}" for path, mods in list(per_file.items())[:shown]]
    if len(per_file) > shown:
        lines.append(f"note: ... and {len(per_file) - shown} more files with imports not found")
    return "\n".join(lines)


def format_json(findings: Sequence[Finding], errors: Sequence[FileError] = ()) -> str:
    """The findings as a JSON list of objects (path, line, col, code, message, detail,
    severity, fix); a file that could not be linted is a row with code ``"ERROR"``."""
    rows: list[dict[str, object]] = [{**asdict(f), "fix": RULES[f.code].fix} for f in findings]
    rows += [
        {
            "path": e.path,
            "line": e.line,
            "col": e.col,
            "code": "ERROR",
            "message": e.message,
            "detail": "file not linted",
            "severity": "error",
            "fix": "make the file valid Python, or leave it out of the paths",
        }
        for e in errors
    ]
    return json.dumps(rows, indent=2)
