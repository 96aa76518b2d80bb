"""``gpu-training lint`` on training scripts nobody here wrote, against a hand triage.

The corpus is nine public repositories at fixed commits (:data:`REPOS`). Their code is never
copied here: this script lints a local checkout of each (``--fetch`` clones them), and
``benchmarks/lint_eval_table.csv`` holds the triage — one row per finding, read in context
(``true``, ``false`` or ``debatable``, with why), plus one ``missed`` row per real instance of a
pitfall the linter does not report. The script compares the two and prints precision (true /
(true + false), per severity) and recall (true / (true + missed)), per rule.

Usage::

    python benchmarks/lint_eval.py --corpus /tmp/lint-corpus --fetch   # clone, then compare
    python benchmarks/lint_eval.py --corpus /tmp/lint-corpus            # compare
    python benchmarks/lint_eval.py --corpus /tmp/lint-corpus --draft new.csv

The checkout of ``owner/name`` is ``<corpus>/owner+name``. Exit status 1 when the table is out of
date: a finding it does not triage, or a triaged finding that is gone (``--draft`` writes the
untriaged findings as rows to fill in).
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gpu_training.diagnostics.lint import LintReport, lint_paths
from gpu_training.diagnostics.lint.rules import BUG, HYGIENE, RULES

TABLE = Path(__file__).resolve().parent / "lint_eval_table.csv"
FIELDS = ("repo", "commit", "path", "line", "rule", "severity", "verdict", "why")
VERDICTS = ("true", "false", "debatable", "missed")

REPOS: dict[str, tuple[str, tuple[str, ...]]] = {
    "pytorch/examples": ("77f55b912142e11fcfdf5b530231fb9c52f181e8", (".",)),
    "karpathy/nanoGPT": ("3adf61e154c3fe3fca428ad6bc3818b27a3b8291", (".",)),
    "karpathy/llm.c": ("f1e2ace651495b74ae22d45d1723443fd00ecd3a", (".",)),
    "facebookresearch/deit": ("7e160fe43f0252d17191b71cbb5826254114ea5b", (".",)),
    "facebookresearch/mae": ("efb2a8062c206524e35e47d04501ed4f544c0ae8", (".",)),
    "huggingface/pytorch-image-models": ("aa4b5850c1543fa488abf260f18390eda46cf85d", (".",)),
    "microsoft/Swin-Transformer": ("f82860bfb5225915aca09c3227159ee9e1df874d", (".",)),
    "huggingface/accelerate": ("16cb6eb80dd9aa8b4df1a63ef57863e455d53b83", ("examples",)),
    "openai/improved-diffusion": ("1bc7bbbdc414d83d4abf2ad8cc1446dc36c4e4d5", (".",)),
}
"""Repository → (commit, the paths linted in it). Accelerate: its examples, not the library."""

Key = tuple[str, str, int, str]


@dataclass(frozen=True)
class Row:
    """One triaged finding, or one missed instance."""

    repo: str
    commit: str
    path: str
    line: int
    rule: str
    severity: str
    verdict: str
    why: str

    @property
    def key(self) -> Key:
        return (self.repo, self.path, self.line, self.rule)


def checkout(corpus: Path, repo: str) -> Path:
    """Where ``repo`` is checked out under ``corpus``."""
    return corpus / repo.replace("/", "+")


def fetch(corpus: Path) -> None:
    """Clone each repository at its commit (skipped when the checkout exists)."""
    for repo, (commit, _) in REPOS.items():
        target = checkout(corpus, repo)
        if target.exists():
            continue
        url = f"https://github.com/{repo}.git"
        subprocess.run(
            ["git", "clone", "--filter=blob:none", "--no-checkout", url, str(target)], check=True
        )
        subprocess.run(["git", "-C", str(target), "checkout", "--quiet", commit], check=True)


def read_table(path: Path = TABLE) -> list[Row]:
    """The triage, checked: known verdicts and rules, one row per key."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = [
            Row(**{**r, "line": int(r["line"])})  # type: ignore[arg-type]
            for r in csv.DictReader(handle)
        ]
    seen: set[Key] = set()
    for row in rows:
        if row.verdict not in VERDICTS or row.rule not in RULES or row.repo not in REPOS:
            raise SystemExit(f"{path}: bad row {row}")
        if row.key in seen:
            raise SystemExit(f"{path}: duplicate row {row.key}")
        seen.add(row.key)
    return rows


def lint_repo(corpus: Path, repo: str) -> tuple[LintReport, dict[Key, str]]:
    """Lint one checkout (hygiene rules included); findings keyed by repo-relative path."""
    root = checkout(corpus, repo)
    if not root.is_dir():
        raise SystemExit(f"{root}: missing checkout (run with --fetch, or clone {repo})")
    report = lint_paths([root / target for target in REPOS[repo][1]], hygiene=True)
    found: dict[Key, str] = {}
    for finding in report.findings:
        rel = Path(finding.path).resolve().relative_to(root.resolve()).as_posix()
        found[(repo, rel, finding.line, finding.code)] = finding.detail
    return report, found


def _ratio(num: int, den: int) -> str:
    return f"{num / den:.0%}" if den else "-"


def summarise(rows: list[Row], severity: str) -> list[str]:
    """Markdown: findings, verdicts, precision and recall per rule of one severity (recall
    only where missed instances were searched for: the bug rules)."""
    lines = [
        "| rule | findings | true | false | debatable | missed | precision | recall |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    total: Counter[str] = Counter()
    for code, rule in RULES.items():
        if rule.severity != severity:
            continue
        counts = Counter(r.verdict for r in rows if r.rule == code)
        if not counts:
            continue
        total.update(counts)
        lines.append(_summary_line(f"{code} {rule.name}", counts, severity == BUG))
    lines.append(_summary_line("**all**", total, severity == BUG))
    return lines


def _summary_line(label: str, c: Counter[str], searched: bool) -> str:
    findings = c["true"] + c["false"] + c["debatable"]
    precision = _ratio(c["true"], c["true"] + c["false"])
    recall = _ratio(c["true"], c["true"] + c["missed"]) if searched else "not searched"
    return (
        f"| {label} | {findings} | {c['true']} | {c['false']} | {c['debatable']} | "
        f"{c['missed']} | {precision} | {recall} |"
    )


def main(argv: list[str] | None = None) -> int:
    """Compare the linter with the triage table; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--corpus", type=Path, required=True, help="where the checkouts are")
    parser.add_argument("--fetch", action="store_true", help="clone missing checkouts first")
    parser.add_argument("--draft", type=Path, help="write untriaged findings here as rows")
    args = parser.parse_args(argv)
    if args.fetch:
        fetch(args.corpus)
    rows = read_table()
    by_key = {r.key: r for r in rows}
    untriaged: list[Row] = []
    gone: list[Row] = []
    files = unlinted = 0
    found_keys: set[Key] = set()
    for repo, (commit, _) in REPOS.items():
        report, found = lint_repo(args.corpus, repo)
        files += report.files
        unlinted += len(report.errors)
        found_keys |= set(found)
        for key, detail in found.items():
            row = by_key.get(key)
            if row is None or row.verdict == "missed":
                severity = RULES[key[3]].severity
                untriaged.append(Row(repo, commit, key[1], key[2], key[3], severity, "", detail))
    for row in rows:
        if row.verdict != "missed" and row.key not in found_keys:
            gone.append(row)
    print(f"{len(REPOS)} repositories, {files} files linted, {unlinted} could not be parsed.\n")
    for severity in (BUG, HYGIENE):
        print(f"### {severity} (default: {'on' if severity == BUG else 'off, --hygiene'})\n")
        print("\n".join(summarise([r for r in rows if r.severity == severity], severity)))
        print()
    for label, problems in (("untriaged finding", untriaged), ("triaged finding gone", gone)):
        for row in problems:
            print(f"{label}: {row.repo} {row.path}:{row.line} {row.rule} {row.why}")
    if args.draft is not None and untriaged:
        with open(args.draft, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, FIELDS)
            writer.writeheader()
            for row in untriaged:
                writer.writerow({f: getattr(row, f) for f in FIELDS})
    return 1 if untriaged or gone else 0


if __name__ == "__main__":
    sys.exit(main())
