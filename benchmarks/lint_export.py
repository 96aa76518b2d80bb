"""Export the repositories of a lint truth set from their fetched snapshots, for scoring.

``lint_truth_score.py`` lints ``<dir>/<owner>+<name>/``, each an export of the repository at
the truth's commit with an empty ``.git`` directory at its root (so the linter finds the
project's root). This writes those exports from the snapshots the ``fetch`` tool left under
``/work/.mirror/<owner>+<name>/`` (a bare git directory, or a clone's ``.git``): every file of
the commit's tree, file by file, skipping blobs the snapshot lacks (files of 4 MiB and more,
Git LFS content: data, not code). Nothing is run; the snapshot's code is only copied out.

Usage::

    python benchmarks/lint_export.py benchmarks/lint_heldout21_truth.csv --out /tmp/h21
    python benchmarks/lint_export.py benchmarks/lint_*_truth.csv --missing  # what to fetch first

Exit status 0; 1 when a snapshot or a commit is missing (each named on stderr); 2 on a bad
argument.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from pathlib import Path

MIRRORS = Path("/work/.mirror")


def pairs(truth: Path) -> list[tuple[str, str]]:
    """The ``(owner/name, commit)`` pairs of a truth CSV, in first-seen order."""
    seen: dict[tuple[str, str], None] = {}
    with truth.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            seen[(row["repo"], row["commit"])] = None
    return list(seen)


def git_dir(repo: str, mirrors: Path = MIRRORS) -> Path | None:
    """The snapshot's git directory for ``owner/name``, or None when it was not fetched."""
    base = mirrors / repo.replace("/", "+")
    for candidate in (base / "repo" / ".git", base / "repo", base):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    return None


def _git(gdir: Path, *args: str) -> bytes:
    return subprocess.run(
        ["git", f"--git-dir={gdir}", *args], check=True, capture_output=True
    ).stdout


def export(gdir: Path, commit: str, into: Path) -> tuple[int, list[str]]:
    """Every blob of ``commit``'s tree under ``into``; returns (files written, paths absent)."""
    listing = _git(gdir, "ls-tree", "-r", "-z", "--full-tree", commit)
    into.mkdir(parents=True, exist_ok=True)
    (into / ".git").mkdir(exist_ok=True)
    written, absent = 0, []
    for entry in listing.split(b"\0"):
        if not entry:
            continue
        meta, _, raw_path = entry.partition(b"\t")
        mode, kind, sha = meta.split()
        path = raw_path.decode("utf-8", "replace")
        if kind != b"blob" or mode == b"120000" or ".." in Path(path).parts:
            continue  # submodules, symbolic links, odd paths
        try:
            data = _git(gdir, "cat-file", "blob", sha.decode())
        except subprocess.CalledProcessError:
            absent.append(path)
            continue
        target = into / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written += 1
    return written, absent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "truth", nargs="+", type=Path, help="truth CSV(s) (repo and commit columns)"
    )
    parser.add_argument("--out", type=Path, help="the export directory (one truth CSV)")
    parser.add_argument("--missing", action="store_true", help="only list snapshots not fetched")
    parser.add_argument("--mirrors", type=Path, default=MIRRORS)
    args = parser.parse_args(argv)
    truths: list[Path] = list(args.truth)
    if not args.missing and (args.out is None or len(truths) != 1):
        print("lint_export: give one truth CSV and --out DIR (or --missing)", file=sys.stderr)
        return 2
    for truth in truths:
        if not truth.is_file():
            print(f"lint_export: {truth}: no such file", file=sys.stderr)
            return 2
    status = 0
    for truth in truths:
        for repo, commit in pairs(truth):
            gdir = git_dir(repo, args.mirrors)
            if gdir is None:
                print(f"not fetched: {repo}", file=sys.stdout if args.missing else sys.stderr)
                status = status if args.missing else 1
                continue
            if args.missing:
                continue
            try:
                written, absent = export(gdir, commit, args.out / repo.replace("/", "+"))
            except subprocess.CalledProcessError as exc:
                print(f"{repo}@{commit[:8]}: {exc.stderr.decode().strip()}", file=sys.stderr)
                status = 1
                continue
            note = f"; absent: {', '.join(absent)}" if absent else ""
            print(f"{repo}@{commit[:8]}: {written} files{note}")
    return status


if __name__ == "__main__":
    sys.exit(main())
