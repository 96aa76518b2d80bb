"""``gpu-training lint`` ``GT007``: a helper's keyword-only path, chosen by its callers.

Issue 33, held-back set 24 (``benchmarks/lint_heldout24_truth.csv``): the lint crashed with a
``ValueError`` on a helper that writes to a keyword-only parameter
(``def log(msg, *, log_file=None): open(log_file, "a")``): the question "does every caller pass
a path with the rank in it?" looked for the parameter among the positional ones only. A
keyword-only path is passed by keyword alone; each caller's decides, as for a positional one.
And a defect like it now stops one file, not the run: the file is reported as not linted, with
the error named, and the other files are linted (exit status 1 | 4).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import gpu_training.diagnostics.lint.checks as lint_checks
from gpu_training.diagnostics.lint import exit_code, lint_paths
from lint_repo import repo_findings

_SCRIPT = """\
import torch.distributed as dist


def log(message, *, log_file=None):
    with open(log_file, "a") as handle:
        handle.write(message)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    log("started", log_file=PATH)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize(
    ("path", "reported"),
    [('f"train_{rank}.log"', False), ('"train.log"', True)],
)
def test_a_keyword_only_path_is_the_callers(tmp_path: Path, path: str, reported: bool) -> None:
    script = _SCRIPT.replace("PATH", path)
    found = repo_findings(tmp_path, {"train.py": script}, "GT007")
    assert [line for _, line in found] == ([5] if reported else [])


def test_a_defect_of_the_lint_stops_one_file_not_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("train.py", "other.py"):
        (tmp_path / name).write_text(_SCRIPT.replace("PATH", '"train.log"'))
    rules = lint_checks.whole_file_rules

    def failing(checker: lint_checks.FileChecker) -> None:
        if checker.facts.path.endswith("other.py"):
            raise ValueError("'log_file' is not in list")
        rules(checker)

    monkeypatch.setattr(lint_checks, "whole_file_rules", failing)
    report = lint_paths([tmp_path])
    assert [(f.path, f.line, f.code) for f in report.findings] == [
        (str(tmp_path / "train.py"), 5, "GT007")
    ]
    assert [(e.path, e.message) for e in report.errors] == [
        (
            str(tmp_path / "other.py"),
            "the lint failed on this file (ValueError: 'log_file' is not in list): please report it",
        )
    ]
    assert exit_code(report) == 1 | 4
