"""Score ``gpu-training lint`` against a ground-truth CSV of a held-back or tuning set.

The truth CSV has the columns ``repo,commit,path,line,rule,verdict,why`` (``verdict`` is ``bug``
or ``correct``), written by reading the code before any linter ran on it. The checkouts lie under
one directory, ``<dir>/<owner>+<name>/``, each an export of the repository at the truth's commit
with a ``.git`` marker directory at its root (so the linter finds the project's root).

Each repository is linted whole, in-process (:func:`lint_paths`, every bug rule, whichever
``gpu_training`` is on ``PYTHONPATH``: run it with ``PYTHONPATH=<another src>`` to score another
version). A finding matches a truth row of the same repository, path and rule whose line is
within 3 (the nearest). It is **true** when that row is ``bug``, **false** when it is
``correct``. A finding no truth row sits beside is looked up in the extra rows (``--extra``:
a set's triage table, ``verdict`` ``true``/``false``, or a CSV of the truth's columns): a finding
read there counts as it was read; one read nowhere counts as false and is listed as **unread**,
for a person to read. An extra row may name, in a ``same_as`` column (``path:line``), the truth
row of the same instance that the reader wrote at another line (the call site where the linter
reports the write inside the helper, say): a ``true`` finding read there also counts that row
as found, so one instance is not counted both true and missed. An extra row at the finding's
very line wins over a truth row a line or two away (another call the truth did not read). A
``bug`` row no finding matched is **missed** (rows of the hygiene rules, ``GT008``
and ``GT010``, aside: only bug-severity findings are scored). Precision is true findings over findings; **recall
is instances found over instances** (``found / (found + missed)``): two findings of one instance
(a helper's write and its call site) are two true findings and one instance found. GT015 (the process group
never destroyed) is reported apart, as the set-6 README does.

Usage::

    PYTHONPATH=src python benchmarks/lint_truth_score.py benchmarks/lint_heldout6_truth.csv \\
        /tmp/h6 --extra benchmarks/lint_heldout6_table.csv
    ... --json        # the same, as JSON

Exit status 0; 2 on a bad argument or a checkout that is missing.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpu_training.diagnostics.lint import lint_paths
from gpu_training.diagnostics.lint.rules import BUG, RULES

APART = ("GT015",)
WINDOW = 3
TRUE_WORDS = {"bug": "bug", "true": "bug", "correct": "correct", "false": "correct"}


@dataclass(frozen=True)
class Row:
    """One truth row (or one extra verdict on a finding)."""

    repo: str
    commit: str
    path: str
    line: int
    rule: str
    verdict: str  # "bug" or "correct"
    why: str = ""
    same_as: str = ""  # extra rows only: "path:line" of the truth row of the same instance


@dataclass
class Tally:
    """Counts of one rule (or of a group of rules)."""

    findings: int = 0
    true: int = 0
    false: int = 0
    missed: int = 0
    found: int = 0
    """Distinct instances found: two true findings of one instance (a helper's write and
    its call site) count once here, twice in ``true``."""

    @property
    def precision(self) -> float | None:
        return self.true / self.findings if self.findings else None

    @property
    def recall(self) -> float | None:
        """Instances found over instances: ``found / (found + missed)``."""
        return self.found / (self.found + self.missed) if self.found + self.missed else None

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "precision": self.precision, "recall": self.recall}


@dataclass
class Score:
    """What :func:`score` found."""

    per_rule: dict[str, Tally] = field(default_factory=dict)
    overall: Tally = field(default_factory=Tally)
    apart: Tally = field(default_factory=Tally)
    false_findings: list[dict[str, object]] = field(default_factory=list)
    unread: list[dict[str, object]] = field(default_factory=list)
    missed: list[dict[str, object]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def read_rows(path: str | Path, *, extra: bool = False) -> list[Row]:
    """The rows of a truth CSV, or of an extra CSV (a triage table's ``true``/``false`` rows;
    its ``missed`` rows are left out: the truth holds them)."""
    rows = []
    with open(path, newline="", encoding="utf-8") as handle:
        for raw in csv.DictReader(handle):
            verdict = TRUE_WORDS.get(raw["verdict"].strip())
            if verdict is None:
                if extra:
                    continue
                raise ValueError(f"{path}: unknown verdict {raw['verdict']!r}")
            rows.append(
                Row(
                    raw["repo"],
                    raw.get("commit", ""),
                    raw["path"],
                    int(raw["line"]),
                    raw["rule"],
                    verdict,
                    raw.get("why", ""),
                    (raw.get("same_as") or "").strip() if extra else "",
                )
            )
    return rows


def checkout_dir(root: Path, repo: str) -> Path:
    return root / repo.replace("/", "+")


def lint_repo(checkout: Path) -> list[tuple[str, int, str, str]]:
    """``(path relative to the checkout, line, rule, detail)`` of every bug-rule finding."""
    report = lint_paths([str(checkout)])
    out = []
    for f in report.findings:
        if RULES[f.code].severity != BUG:
            continue
        rel = Path(f.path).resolve().relative_to(checkout.resolve()).as_posix()
        out.append((rel, f.line, f.code, f.detail))
    return out


def _nearest(rows: list[Row], path: str, line: int, rule: str) -> Row | None:
    near = [r for r in rows if r.path == path and r.rule == rule and abs(r.line - line) <= WINDOW]
    return min(near, key=lambda r: abs(r.line - line)) if near else None


def score(
    truth: list[Row],
    findings: dict[str, list[tuple[str, int, str, str]]],
    extra: Sequence[Row] = (),
) -> Score:
    """Match ``findings`` (per repository) to ``truth`` and ``extra``; count per rule."""
    result = Score()
    by_repo: dict[str, list[Row]] = defaultdict(list)
    for t in truth:
        by_repo[t.repo].append(t)
    extra_by_repo: dict[str, list[Row]] = defaultdict(list)
    for e in extra:
        extra_by_repo[e.repo].append(e)
    tallies: dict[str, Tally] = defaultdict(Tally)
    found: set[Row] = set()
    instances: dict[str, set[Row]] = defaultdict(set)  # per rule: the truth or extra rows found
    for repo in sorted(set(by_repo) | set(findings)):
        for path, line, rule, detail in findings.get(repo, []):
            tally = tallies[rule]
            tally.findings += 1
            where = {"repo": repo, "path": path, "line": line, "rule": rule, "detail": detail}
            match = _nearest(by_repo[repo], path, line, rule)
            exact = _nearest(extra_by_repo[repo], path, line, rule)
            if match is not None and match.line != line and exact and exact.line == line:
                match = None  # a row read at this very line: the truth's row near it is another
            read = match or _nearest(extra_by_repo[repo], path, line, rule)
            if read is not None and read.verdict == "bug":
                tally.true += 1
                same = [
                    t
                    for t in by_repo[repo]
                    if read.same_as and f"{t.path}:{t.line}" == read.same_as and t.rule == rule
                ]
                if match is not None:
                    found.add(match)
                    instances[rule].add(match)
                elif same:
                    found.update(same)
                    instances[rule].update(same)
                else:  # an instance the truth lacks, read true in the extra rows
                    instances[rule].add(read)
                continue
            tally.false += 1
            if read is None:
                result.unread.append(where)
            else:
                result.false_findings.append({**where, "why": read.why})
    for row in truth:
        if row.rule in RULES and RULES[row.rule].severity != BUG:
            continue  # a hygiene rule's row (GT008, GT010): its findings are not scored either
        if row.verdict == "bug" and row not in found:
            tallies[row.rule].missed += 1
            result.missed.append(
                {"repo": row.repo, "path": row.path, "line": row.line, "rule": row.rule}
            )
    for rule, rows in instances.items():
        tallies[rule].found = len(rows)
    result.per_rule = dict(sorted(tallies.items()))
    for rule, tally in result.per_rule.items():
        total = result.apart if rule in APART else result.overall
        total.findings += tally.findings
        total.true += tally.true
        total.false += tally.false
        total.missed += tally.missed
        total.found += tally.found
    return result


def run(truth_csv: str, root: str, extra_csvs: list[str]) -> Score:
    truth = read_rows(truth_csv)
    extra = [row for path in extra_csvs for row in read_rows(path, extra=True)]
    base = Path(root)
    findings = {}
    missing = []
    for repo in sorted({r.repo for r in truth}):
        checkout = checkout_dir(base, repo)
        if not checkout.is_dir():
            missing.append(str(checkout))
            continue
        findings[repo] = lint_repo(checkout)
    result = score([r for r in truth if r.repo in findings], findings, extra)
    result.errors = [f"missing checkout {m}" for m in missing]
    return result


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def format_text(result: Score) -> str:
    lines = [f"{'rule':8} findings true false found missed precision recall"]
    for rule, t in result.per_rule.items():
        lines.append(
            f"{rule:8} {t.findings:8} {t.true:4} {t.false:5} {t.found:5} {t.missed:6} "
            f"{_pct(t.precision):>9} {_pct(t.recall):>6}"
        )
    for name, t in (("overall (bug rules, GT015 apart)", result.overall), ("GT015", result.apart)):
        lines.append(
            f"{name}: findings {t.findings}, true {t.true}, false {t.false}, instances found "
            f"{t.found}, missed {t.missed}, precision {_pct(t.precision)}, recall {_pct(t.recall)}"
        )
    for title, items in (
        ("unread findings (no truth or extra row beside them; counted false)", result.unread),
        ("false findings (a correct row)", result.false_findings),
        ("missed", result.missed),
    ):
        if items:
            lines.append(f"{title}:")
            lines += [f"  {i['repo']} {i['path']}:{i['line']} {i['rule']}" for i in items]
    lines += result.errors
    return "\n".join(lines)


def as_json(result: Score) -> str:
    return json.dumps(
        {
            "per_rule": {k: v.as_dict() for k, v in result.per_rule.items()},
            "overall": result.overall.as_dict(),
            "apart": result.apart.as_dict(),
            "unread": result.unread,
            "false": result.false_findings,
            "missed": result.missed,
            "errors": result.errors,
        },
        indent=2,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("truth", help="truth CSV (repo,commit,path,line,rule,verdict,why)")
    parser.add_argument("checkouts", help="directory of <owner>+<name>/ exports")
    parser.add_argument(
        "--extra",
        "--extra-false",
        action="append",
        default=[],
        help="CSV of verdicts on findings no truth row sits beside (a triage table)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    result = run(args.truth, args.checkouts, args.extra)
    print(as_json(result) if args.json else format_text(result))
    return 2 if result.errors else 0


if __name__ == "__main__":
    sys.exit(main())
