"""Does ``gpu-training lint`` give one answer however it is run? (issue 33, item 2)

For every repository checkout under the directories given (one ``<owner>+<name>`` directory
each, as the held-back sets' exports are laid out), lint the whole repository once, then
every Python file of it alone (test trees aside, as a directory run skips them), and compare
each file's findings with what the repository run reported for it. Prints each file whose
answers differ (the findings only the repository run has, and those only the file alone
has) and a summary line; exits 1 when any differs.

Usage::

    PYTHONPATH=src python benchmarks/lint_one_answer.py /tmp/h4 /tmp/h5 /tmp/h6 [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # runs from a checkout without an install

from gpu_training.diagnostics.lint.report import collect_files, lint_paths  # noqa: E402

Answer = set[tuple[int, str]]


def _by_file(paths: list[Path]) -> dict[Path, Answer]:
    found: dict[Path, Answer] = {}
    for finding in lint_paths(paths).findings:
        found.setdefault(Path(finding.path).resolve(), set()).add((finding.line, finding.code))
    return found


def compare(repository: Path) -> tuple[int, list[dict[str, object]]]:
    """``(files checked, the files whose alone answer differs from the repository's)``."""
    whole = _by_file([repository])
    differing: list[dict[str, object]] = []
    files = collect_files([repository])
    for file in files:
        alone = _by_file([file]).get(file.resolve(), set())
        expected = whole.get(file.resolve(), set())
        if alone != expected:
            differing.append(
                {
                    "file": str(file),
                    "repository_only": sorted(expected - alone),
                    "alone_only": sorted(alone - expected),
                }
            )
    return len(files), differing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sets", nargs="+", type=Path, help="directories of repository checkouts")
    parser.add_argument("--json", type=Path, default=None, help="write every row here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    checked, rows = 0, []
    repositories = [r for s in args.sets for r in sorted(s.iterdir()) if r.is_dir()]
    for repository in repositories:
        count, differing = compare(repository)
        checked += count
        rows += differing
        for row in differing:
            print(
                f"{row['file']}: only in the repository run {row['repository_only']}, "
                f"only alone {row['alone_only']}",
                flush=True,
            )
    seconds = time.perf_counter() - started
    print(
        f"{len(repositories)} repositories, {checked} files linted alone: {len(rows)} answer "
        f"differently from their repository's run ({seconds:.0f} s)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"checked": checked, "differing": rows}, indent=1))
    return 1 if rows else 0


if __name__ == "__main__":
    raise SystemExit(main())
