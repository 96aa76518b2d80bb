"""``benchmarks/lint_sample.py``: the sampled-precision figures (issue 33), on tables made here,
and the committed sample drawn again from the committed population."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bench_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sample():
    return load_benchmark("lint_sample")


def _row(line: int, rule: str, verdict: str, defect: str, category: str = "") -> dict[str, str]:
    return {
        "repo": "o/r", "path": "train.py", "line": str(line), "rule": rule,
        "verdict": verdict, "defect": defect, "category": category,
    }  # fmt: skip


def test_score_counts_both_judgements(sample) -> None:
    rows = [
        _row(1, "GT007", "true", "yes"),
        _row(2, "GT007", "false", "yes", "one_node"),
        _row(3, "GT006", "false", "no", "guarded"),
        _row(4, "GT006", "unread", "no"),
    ]
    text = sample.score(rows)
    assert "precision 33.3% (1 of 3, verdict); 66.7% (2, defect)" in text
    assert "GT006: 1 findings, 0 true, 0 defect" in text
    assert "false by category: one_node 1, guarded 1" in text


def test_a_later_version_drops_what_it_no_longer_reports(sample) -> None:
    rows = [_row(1, "GT007", "true", "yes"), _row(3, "GT006", "false", "no", "guarded")]
    now = {"o+r": [["train.py", 1, "GT007", "m -- d"], ["train.py", 9, "GT003", "new"]]}
    text = sample.score(rows, now)
    assert "still reported 1 of 2: gone 1 (0 true, 1 false)" in text
    assert "precision 100.0% (1 of 1, verdict)" in text


def test_the_committed_sample_is_the_seeded_draw(sample) -> None:
    findings = json.loads((ROOT / "benchmarks" / "lint_ddpsample_population.json").read_text())
    drawn = sample.draw(findings, 72, 20261207)
    with (ROOT / "benchmarks" / "lint_ddpsample_triage.csv").open(newline="") as handle:
        read = list(csv.DictReader(handle))
    assert sorted(d[:4] for d in drawn) == sorted(
        (r["repo"], r["path"], int(r["line"]), r["rule"]) for r in read
    )
    assert {r["verdict"] for r in read} <= {"true", "false"}
    assert {r["defect"] for r in read} <= {"yes", "no"}
    assert all(r["category"] for r in read if r["verdict"] == "false")


def test_a_second_draw_leaves_out_what_was_read(sample) -> None:
    findings = {"o+r": [["a.py", i, "GT007", "m"] for i in range(1, 11)]}
    first = sample.draw(findings, 4, 1)
    read = frozenset(f[:4] for f in first)
    second = sample.draw(findings, 6, 2, read)
    assert not {f[:4] for f in second} & read
    assert len(second) == 6


def test_the_second_sample_is_the_seeded_draw_past_the_first(sample) -> None:
    bench = ROOT / "benchmarks"
    findings = json.loads((bench / "lint_ddpsample2_population.json").read_text())
    with (bench / "lint_ddpsample_triage.csv").open(newline="") as handle:
        first = frozenset(sample._key(r) for r in csv.DictReader(handle))
    drawn = sample.draw(findings, 48, 20261208, first)
    with (bench / "lint_ddpsample2_triage.csv").open(newline="") as handle:
        read = list(csv.DictReader(handle))
    assert sorted(d[:4] for d in drawn) == sorted(sample._key(r) for r in read)
    assert {r["verdict"] for r in read} <= {"true", "false"}


def test_the_third_sample_is_the_command_line_draw_past_both(sample, tmp_path) -> None:
    bench = ROOT / "benchmarks"
    out = tmp_path / "third.csv"
    argv = ["draw", str(bench / "lint_ddpsample2_population.json"), "--n", "48"]
    argv += ["--seed", "20261209", "--out", str(out)]
    for table in ("lint_ddpsample_triage.csv", "lint_ddpsample2_triage.csv"):
        argv += ["--exclude", str(bench / table)]
    assert sample.main(argv) == 0
    with out.open(newline="") as handle:
        drawn = [sample._key(r) for r in csv.DictReader(handle)]
    with (bench / "lint_ddpsample3_triage.csv").open(newline="") as handle:
        read = list(csv.DictReader(handle))
    assert sorted(drawn) == sorted(sample._key(r) for r in read)
    assert {r["verdict"] for r in read} <= {"true", "false"}
    assert {r["defect"] for r in read} <= {"yes", "no"}
    earlier = set()
    for table in ("lint_ddpsample_triage.csv", "lint_ddpsample2_triage.csv"):
        with (bench / table).open(newline="") as handle:
            earlier |= {sample._key(r) for r in csv.DictReader(handle)}
    assert not set(drawn) & earlier


@pytest.mark.parametrize(
    ("table", "population", "n", "seed", "earlier"),
    [
        ("4", "lint_ddpsample2_population.json", 60, 20261210, ("", "2", "3")),
        # the fifth: drawn from round 27's findings (a40d459), past the first four
        ("5", "lint_ddpsample5_population.json", 48, 20261211, ("", "2", "3", "4")),
        ("6", "lint_ddpsample6_population.json", 48, 20261212, ("", "2", "3", "4", "5")),
    ],
    ids=["fourth", "fifth", "sixth"],
)
def test_a_later_sample_is_the_seeded_draw_past_the_earlier_ones(
    sample, table, population, n, seed, earlier
) -> None:
    bench = ROOT / "benchmarks"
    findings = json.loads((bench / population).read_text())
    read: set = set()
    for k in earlier:
        with (bench / f"lint_ddpsample{k}_triage.csv").open(newline="") as handle:
            read |= {sample._key(r) for r in csv.DictReader(handle)}
    drawn = sample.draw(findings, n, seed, frozenset(read))
    with (bench / f"lint_ddpsample{table}_triage.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(d[:4] for d in drawn) == sorted(sample._key(r) for r in rows)
    assert {r["verdict"] for r in rows} <= {"true", "false"}
    assert {r["defect"] for r in rows} <= {"yes", "no"}


def test_a_file_that_is_no_triage_table_is_one_line_and_exit_2(sample, tmp_path, capsys) -> None:
    table = tmp_path / "t.csv"
    table.write_text("a,b\n1,2\n")
    assert sample.main(["score", str(table)]) == 2
    assert "not a triage table" in capsys.readouterr().err
    assert sample.main(["score", str(tmp_path / "missing.csv")]) == 2
