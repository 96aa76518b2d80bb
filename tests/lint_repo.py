"""A small repository written for one ``gpu-training lint`` test, and what lint finds in it.

Many lint tests need a project rather than a file (a trainer module imported by a launched
script, a launch script naming its entry point): they write it under ``tmp_path`` with a
``.git`` marker (so the project root is found) and ask which lines one rule flags.
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint.report import lint_paths


def write_repo(root: Path, files: dict[str, str]) -> Path:
    """Write ``{relative path: text}`` under ``root`` (a repository: ``.git`` marks its root)."""
    (root / ".git").mkdir(exist_ok=True)
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def repo_findings(root: Path, files: dict[str, str], code: str) -> list[tuple[str, int]]:
    """``(file name, line)`` of each ``code`` finding of a directory run over the written repo."""
    found = lint_paths([write_repo(root, files)]).findings
    return sorted((Path(f.path).name, f.line) for f in found if f.code == code)
