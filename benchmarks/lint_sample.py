"""Precision of ``lint`` on a random sample of its findings over repositories nobody tuned on.

A truth set measures precision and recall on a few repositories read whole; this measures
precision alone on many: ``lint`` runs over a corpus of exported repositories, a seeded random
sample of its bug-severity findings (GT015 apart, as in the truth sets) is read by people who
never saw the lint's code, and each finding gets two judgements (``lint_ddpsample_triage.csv``):

- ``verdict`` (``true``/``false``): the held-back sets' convention -- the flagged code is the
  problem the rule names *and* a launch the repository ships or documents with more than one
  process reaches it (one-node-only GT017/GT018 findings are ``false``, category ``one_node``);
- ``defect`` (``yes``/``no``): the code alone, run the way its author evidently means to run it
  distributed (unrelated crashes, unreached flags and the second node aside).

Usage::

    python benchmarks/lint_sample.py lint /tmp/dds --out findings.json     # lint every repository
    python benchmarks/lint_sample.py draw findings.json --n 72 --seed 20261207 --out sample.csv
    python benchmarks/lint_sample.py score benchmarks/lint_ddpsample_triage.csv
    python benchmarks/lint_sample.py score benchmarks/lint_ddpsample_triage.csv --now findings.json

``--now`` re-reads the sample against a later version's findings: a sampled finding that
version no longer reports leaves the sample (a ``true`` one lost, a ``false`` one gone); new
findings of that version are not in the sample and are counted apart, unread.
The exports come from ``lint_export.py benchmarks/lint_ddpsample_repos.csv --out DIR``.

The sample read first (``lint_ddpsample_triage.csv``) was drawn from
``lint_ddpsample_population.json``: the findings of ``3327dda`` over the exports round 21's check
had made (``draw benchmarks/lint_ddpsample_population.json`` gives it again). Those exports were
incomplete for nine repositories (no findings there; complete exports give 579 findings where
these give 469) and held four scratch directories of that check (``exp1``-``exp3``, ``work``:
15 findings, none drawn); every sampled repository's findings are the same in complete exports.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import random
import sys
from pathlib import Path

APART = frozenset({"GT015"})
"""Reported apart from the bug figures, as in the truth sets (never destroyed)."""

Key = tuple[str, str, int, str]


def lint_corpus(root: Path) -> dict[str, list[list[object]]]:
    """``{owner+name: [[path, line, rule, message -- detail], ...]}`` for each repository."""
    from gpu_training.diagnostics.lint import lint_paths

    found: dict[str, list[list[object]]] = {}
    for repo in sorted(p for p in root.iterdir() if p.is_dir()):
        report = lint_paths([repo])
        found[repo.name] = sorted(
            [str(Path(f.path).relative_to(repo)), f.line, f.code, f"{f.message} -- {f.detail}"]
            for f in report.findings
            if f.severity == "bug"
        )
    return found


def population(findings: dict[str, list[list[object]]]) -> list[tuple[str, str, int, str, str]]:
    """Every bug-severity finding outside :data:`APART`, in a fixed order."""
    return [
        (repo.replace("+", "/", 1), str(path), int(str(line)), str(rule), str(text))
        for repo, rows in sorted(findings.items())
        for path, line, rule, text in rows
        if rule not in APART
    ]


def draw(
    findings: dict[str, list[list[object]]],
    n: int,
    seed: int,
    exclude: frozenset[Key] = frozenset(),
) -> list[tuple]:
    """A seeded uniform sample of ``n`` findings of :func:`population`, sorted, leaving out
    ``exclude`` (``(repo, path, line, rule)`` of findings read before)."""
    pool = [f for f in population(findings) if f[:4] not in exclude]
    return sorted(random.Random(seed).sample(pool, n))


def _key(row: dict[str, str]) -> Key:
    return (row["repo"], row["path"], int(row["line"]), row["rule"])


def score(rows: list[dict[str, str]], now: dict[str, list[list[object]]] | None = None) -> str:
    """The figures of a triage table, optionally re-read against a later version's findings."""
    lines = []
    kept = rows
    if now is not None:
        current = collections.Counter(
            (repo, path, line, rule) for repo, path, line, rule, _ in population(now)
        )
        kept = []
        for row in rows:
            if current[_key(row)] > 0:
                current[_key(row)] -= 1
                kept.append(row)
        gone = [r for r in rows if r not in kept]
        lost = sum(r["verdict"] == "true" for r in gone)
        lines.append(
            f"still reported {len(kept)} of {len(rows)}: gone {len(gone)} "
            f"({lost} true, {len(gone) - lost} false)"
        )
    read = [r for r in kept if r["verdict"] in ("true", "false")]
    true = sum(r["verdict"] == "true" for r in read)
    defect = sum(r["defect"] == "yes" for r in read)
    if read:
        lines.append(
            f"precision {100 * true / len(read):.1f}% ({true} of {len(read)}, verdict); "
            f"{100 * defect / len(read):.1f}% ({defect}, defect)"
        )
    per_rule: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for r in read:
        tally = per_rule[r["rule"]]
        tally[0] += 1
        tally[1] += r["verdict"] == "true"
        tally[2] += r["defect"] == "yes"
    for rule, (n, t, d) in sorted(per_rule.items()):
        lines.append(f"  {rule}: {n} findings, {t} true, {d} defect")
    cats = collections.Counter(r["category"] for r in read if r["verdict"] == "false")
    lines.append("false by category: " + ", ".join(f"{c} {k}" for c, k in cats.most_common()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_lint = sub.add_parser("lint", help="lint every exported repository under DIR")
    p_lint.add_argument("root", type=Path)
    p_lint.add_argument("--out", type=Path, required=True)
    p_draw = sub.add_parser("draw", help="draw the sample to read")
    p_draw.add_argument("findings", type=Path)
    p_draw.add_argument("--n", type=int, default=72)
    p_draw.add_argument("--seed", type=int, default=20261207)
    p_draw.add_argument("--out", type=Path, required=True)
    p_draw.add_argument(
        "--exclude",
        type=Path,
        action="append",
        default=[],
        help="a triage table whose findings were read (repeat for several)",
    )
    p_score = sub.add_parser("score", help="the figures of a triage table")
    p_score.add_argument("triage", type=Path)
    p_score.add_argument("--now", type=Path, help="a later version's findings (lint's JSON)")
    args = parser.parse_args(argv)
    if args.cmd == "lint":
        if not args.root.is_dir():
            print(f"lint_sample: {args.root}: not a directory", file=sys.stderr)
            return 2
        args.out.write_text(json.dumps(lint_corpus(args.root), indent=0))
        return 0
    for path in (
        getattr(args, "findings", None),
        getattr(args, "triage", None),
        args.__dict__.get("now"),
        *args.__dict__.get("exclude", []),
    ):
        if path is not None and not path.is_file():
            print(f"lint_sample: {path}: no such file", file=sys.stderr)
            return 2
    if args.cmd == "draw":
        findings = json.loads(args.findings.read_text())
        read: set[Key] = set()
        for table in args.exclude:
            with table.open(newline="", encoding="utf-8") as handle:
                read.update(_key(row) for row in csv.DictReader(handle))
        with args.out.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["repo", "path", "line", "rule", "finding"])
            writer.writerows(draw(findings, args.n, args.seed, frozenset(read)))
        return 0
    with args.triage.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    try:
        now = json.loads(args.now.read_text()) if args.now else None
        print(score(rows, now))
    except (KeyError, ValueError, TypeError) as exc:  # a column missing, a line not a number
        print(f"lint_sample: {args.triage}: not a triage table ({exc!r})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
