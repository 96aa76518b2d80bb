"""``benchmarks/lint_truth_score.py``: a truth CSV scored against the linter, on a synthetic
checkout written here (no fetched code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def scorer():
    return load_benchmark("lint_truth_score")


SCRIPT = """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(2, 2).cuda())
    for step in range(10):
        pass
    torch.save(model.state_dict(), "ckpt.pt")
    torch.save(model.state_dict(), "ckpt2.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""

HEADER = "repo,commit,path,line,rule,verdict,why\n"


@pytest.fixture()
def checkout(tmp_path):
    repo = tmp_path / "sets" / "someone+proj"
    (repo / ".git").mkdir(parents=True)
    (repo / "train.py").write_text(SCRIPT)
    truth = tmp_path / "truth.csv"
    truth.write_text(
        HEADER
        + "someone/proj,abc,train.py,9,GT007,bug,every rank saves (line 11: the nearest row within 3)\n"
        + "someone/proj,abc,train.py,14,GT007,correct,read as fine (line 12: a false finding)\n"
        + "someone/proj,abc,train.py,9,GT005,bug,never found: missed\n"
        + "someone/proj,abc,train.py,40,GT006,bug,too far from line 11: missed\n"
    )
    extra = tmp_path / "table.csv"
    extra.write_text(
        "repo,commit,path,line,rule,verdict,before,after,why\n"
        + "someone/proj,abc,train.py,8,GT002,false,-,-,one GPU per host\n"
        + "someone/proj,abc,train.py,9,GT005,missed,-,-,ignored: the truth holds misses\n"
    )
    return tmp_path, truth, extra


def test_findings_are_matched_by_path_rule_and_line_within_3(scorer, checkout):
    root, truth, extra = checkout
    result = scorer.run(str(truth), str(root / "sets"), [str(extra)])
    assert result.errors == []
    gt007 = result.per_rule["GT007"]
    assert (gt007.findings, gt007.true, gt007.false, gt007.missed) == (2, 1, 1, 0)
    gt002 = result.per_rule["GT002"]
    assert (gt002.findings, gt002.true, gt002.false) == (1, 0, 1)  # read false in the table
    assert result.per_rule["GT005"].missed == 1
    gt006 = result.per_rule["GT006"]
    assert gt006.missed == 1 and gt006.true == 0 and gt006.false == gt006.findings >= 1
    assert {(u["path"], u["line"], u["rule"]) for u in result.unread} >= {("train.py", 11, "GT006")}
    assert all(u["rule"] != "GT002" for u in result.unread)  # the table read it
    o = result.overall
    assert o.true == 1 and o.missed == 2 and o.false == o.findings - 1
    assert result.apart.findings == 0  # destroy_process_group: no GT015


def test_a_hygiene_rules_row_is_no_missed_bug(scorer):
    truth = [
        scorer.Row("a/b", "", "x.py", 5, "GT008", "bug"),  # a print on every rank: hygiene
        scorer.Row("a/b", "", "x.py", 9, "GT007", "bug"),
    ]
    result = scorer.score(truth, {"a/b": []})
    assert result.overall.missed == 1
    assert [m["rule"] for m in result.missed] == ["GT007"]


def test_gt015_is_counted_apart(scorer):
    truth = [
        scorer.Row("a/b", "", "x.py", 5, "GT015", "bug"),
        scorer.Row("a/b", "", "x.py", 9, "GT007", "bug"),
    ]
    findings = {"a/b": [("x.py", 5, "GT015", ""), ("x.py", 7, "GT007", "")]}
    result = scorer.score(truth, findings)
    assert (result.apart.findings, result.apart.true) == (1, 1)
    assert (result.overall.findings, result.overall.true, result.overall.missed) == (1, 1, 0)
    assert result.overall.precision == 1.0 and result.overall.recall == 1.0


def test_cli_json_and_text(scorer, checkout, capsys):
    root, truth, extra = checkout
    assert scorer.main([str(truth), str(root / "sets"), "--extra", str(extra), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["overall"]["true"] == 1 and data["per_rule"]["GT007"]["false"] == 1
    assert scorer.main([str(truth), str(root / "sets")]) == 0
    text = capsys.readouterr().out
    assert "overall (bug rules, GT015 apart)" in text and "unread findings" in text


def test_a_missing_checkout_is_an_error(scorer, tmp_path):
    truth = tmp_path / "t.csv"
    truth.write_text(HEADER + "x/y,c,a.py,1,GT007,bug,\n")
    assert scorer.main([str(truth), str(tmp_path)]) == 2


def test_an_extra_row_can_name_the_truth_row_of_the_same_instance(scorer, tmp_path):
    """The reader wrote the instance at its call site (line 40), the linter reports the write
    (line 11): the extra row's ``same_as`` counts the truth row found, not missed."""
    truth = [scorer.Row("o/p", "c", "train.py", 40, "GT007", "bug")]
    findings = {"o/p": [("train.py", 11, "GT007", "saves")]}
    plain = scorer.Row("o/p", "", "train.py", 11, "GT007", "bug", "the same write")
    linked = scorer.Row("o/p", "", "train.py", 11, "GT007", "bug", "the same write", "train.py:40")
    before = scorer.score(truth, findings, [plain]).overall
    after = scorer.score(truth, findings, [linked]).overall
    assert (before.true, before.missed) == (1, 1)  # true, and the instance missed as well
    assert (after.true, after.missed) == (1, 0)
    other_rule = scorer.Row("o/p", "", "train.py", 11, "GT007", "bug", "", "train.py:41")
    assert scorer.score(truth, findings, [other_rule]).overall.missed == 1  # no such row


def test_same_as_is_read_from_an_extra_csv(scorer, tmp_path):
    extra = tmp_path / "extra.csv"
    extra.write_text(
        "repo,commit,path,line,rule,verdict,why,same_as\n"
        "o/p,,helpers.py,328,GT017,bug,the helper's write,train.py:219\n"
        "o/p,,helpers.py,330,GT017,bug,no link,\n"
    )
    rows = scorer.read_rows(extra, extra=True)
    assert [r.same_as for r in rows] == ["train.py:219", ""]
    truth = tmp_path / "truth.csv"
    truth.write_text(HEADER + "o/p,c,train.py,219,GT017,bug,x\n")
    assert scorer.read_rows(truth)[0].same_as == ""  # truth rows never link


def test_recall_counts_instances_not_findings(scorer):
    """Two true findings of one instance (the call site linked by ``same_as``, and the write
    beside the truth row) are two true findings but one instance found: recall 1 of 2
    instances, not 2 of 3."""
    truth = [
        scorer.Row("o/p", "c", "utils.py", 20, "GT006", "bug"),
        scorer.Row("o/p", "c", "train.py", 90, "GT006", "bug"),
    ]
    findings = {"o/p": [("utils.py", 21, "GT006", "the write"), ("train.py", 50, "GT006", "call")]}
    call = scorer.Row("o/p", "", "train.py", 50, "GT006", "bug", "the call site", "utils.py:20")
    result = scorer.score(truth, findings, [call]).overall
    assert (result.findings, result.true, result.found, result.missed) == (2, 2, 1, 1)
    assert result.precision == 1.0 and result.recall == 0.5
    # an instance the truth lacks, read true in the extra rows, is an instance found
    unlisted = scorer.Row("o/p", "", "train.py", 50, "GT006", "bug", "another instance")
    result = scorer.score(truth, findings, [unlisted]).overall
    assert (result.true, result.found, result.missed) == (2, 2, 1)


def test_an_extra_row_at_the_very_line_wins_over_a_truth_row_nearby(scorer):
    """The truth read another call two lines up (a SummaryWriter, correct); the finding is the
    helper call below it, read in the extra rows as true: it counts true, not false."""
    truth = [scorer.Row("o/p", "c", "train.py", 72, "GT007", "correct")]
    findings = {"o/p": [("train.py", 74, "GT007", "save_log runs open")]}
    read_here = scorer.Row("o/p", "", "train.py", 74, "GT007", "bug", "the helper call")
    read_near = scorer.Row("o/p", "", "train.py", 75, "GT007", "bug", "another line")
    assert scorer.score(truth, findings, [read_here]).overall.true == 1
    assert scorer.score(truth, findings, [read_near]).overall.false == 1  # the truth row wins
    assert scorer.score(truth, findings).overall.false == 1


def test_pool_sums_the_sets_per_rule_and_refuses_what_is_not_a_result(tmp_path, capsys):
    pool = load_benchmark("lint_pool")
    a, b, bad = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "bad.json"
    counts = {"findings": 4, "true": 1, "false": 3, "found": 1, "missed": 3}
    a.write_text(json.dumps({"per_rule": {"GT007": counts, "GT015": counts}}))
    b.write_text(json.dumps({"per_rule": {"GT007": {**counts, "true": 4, "false": 0}}}))
    bad.write_text(json.dumps({"overall": {}}))
    assert pool.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    # GT007: 8 findings, 5 true; instances 2 found, 6 missed; GT015 stays apart
    assert "findings 8, true 5, false 3, instances found 2, missed 6, precision 62.5%" in out
    assert "recall 25.0%" in out and "GT015: findings 4, true 1" in out
    assert pool.main([str(a), str(bad)]) == 2
    assert "no per_rule" in capsys.readouterr().err
    assert pool.main([str(tmp_path / "absent.json")]) == 2
