"""Pool several ``lint_truth_score.py --json`` results into one table per rule.

Each held-back set is small (10-50 findings), so one set's precision moves by 10 points
with two findings. Pooling the sets, each scored with the linter version that first saw it,
gives the figure a fresh repository can expect, per rule. The counting is the scorer's
(:mod:`lint_truth_score`): precision is true findings over findings, recall instances found
over instances; GT015 is reported apart.

Usage::

    PYTHONPATH=<old src> python benchmarks/lint_truth_score.py <truth> <dir> --json > s8.json
    ...
    python benchmarks/lint_pool.py s8.json s9.json s10.json

Exit status 0; 2 when a file is missing or is not a scorer result.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lint_truth_score import APART, Score, Tally, format_text

FIELDS = ("findings", "true", "false", "found", "missed")


def pool(results: list[dict[str, object]]) -> Score:
    """The per-rule tallies of ``results`` (the scorer's JSON, parsed) summed.

    Example:
        >>> one = {"per_rule": {"GT007": {"findings": 2, "true": 1, "false": 1,
        ...                               "found": 1, "missed": 1}}}
        >>> two = {"per_rule": {"GT007": {"findings": 1, "true": 1, "false": 0,
        ...                               "found": 1, "missed": 0}}}
        >>> s = pool([one, two])
        >>> s.overall.findings, s.overall.true, round(s.overall.precision, 3), s.overall.recall
        (3, 2, 0.667, 0.6666666666666666)
    """
    result = Score()
    per_rule: dict[str, Tally] = {}
    for data in results:
        rules = data.get("per_rule")
        if not isinstance(rules, dict):
            raise ValueError("not a lint_truth_score.py --json result (no per_rule)")
        for rule, counts in rules.items():
            tally = per_rule.setdefault(rule, Tally())
            for name in FIELDS:
                setattr(tally, name, getattr(tally, name) + int(counts[name]))
    result.per_rule = dict(sorted(per_rule.items()))
    for rule, tally in result.per_rule.items():
        total = result.apart if rule in APART else result.overall
        for name in FIELDS:
            setattr(total, name, getattr(total, name) + getattr(tally, name))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="JSON files of lint_truth_score.py --json")
    args = parser.parse_args(argv)
    loaded = []
    for name in args.results:
        try:
            loaded.append(json.loads(Path(name).read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            print(f"lint_pool: {name}: {exc}", file=sys.stderr)
            return 2
    try:
        result = pool(loaded)
    except (ValueError, KeyError, TypeError) as exc:
        print(f"lint_pool: {exc}", file=sys.stderr)
        return 2
    print(format_text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
