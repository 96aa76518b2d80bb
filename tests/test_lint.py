"""``gpu-training lint``: every rule on a corpus of small scripts, 100% precision and recall.

tests/lint_corpus/bad/ holds scripts with pitfalls, each finding marked on its line with
``# expect: GTxxx``; tests/lint_corpus/good/ holds correct scripts, among them the guides'
correct snippets (shared/seeds/*.txt), and examples/ must lint clean too. Guide snippets that
keep a pitfall the guides themselves warn about live in bad/, named ``guide_*``.
"""

from __future__ import annotations

import json
import re
import sys
import sysconfig
from collections import Counter
from pathlib import Path

import pytest

from dist_harness import REPO_ROOT, run_python
from gpu_training.cli import main
from gpu_training.diagnostics.lint import (
    LintError,
    collect_files,
    format_text,
    lint_paths,
    lint_source,
    select_rules,
)
from gpu_training.diagnostics.lint_rules import GUIDES, RULES, explain

CORPUS = Path(__file__).resolve().parent / "lint_corpus"
BAD = CORPUS / "bad"
GOOD = CORPUS / "good"
EXAMPLES = REPO_ROOT / "examples"
_EXPECT = re.compile(r"#.*\bexpect:\s*((?:GT\d{3}[,\s]*)+)")


def _expected(files: list[Path]) -> set[tuple[str, int, str]]:
    found = set()
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            match = _EXPECT.search(line)
            if match:
                found |= {(str(path), number, c) for c in re.findall(r"GT\d{3}", match[1])}
    return found


def _one_error_line(stderr: str, *needles: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("gpu-training: error: lint"), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


# --- the corpus ---------------------------------------------------------------------------------


def test_corpus_precision_and_recall_are_100_percent() -> None:
    bad = collect_files([BAD])
    good = collect_files([GOOD, EXAMPLES])
    expected = _expected(bad)
    assert not _expected(good), "good/ and examples/ must carry no expect markers"
    findings, files = lint_paths([BAD, GOOD, EXAMPLES])
    got = {(f.path, f.line, f.code) for f in findings}
    true_pos = got & expected
    false_pos = got - expected
    false_neg = expected - got
    print(f"\nlint corpus: {files} files ({len(bad)} bad, {len(good)} good incl. examples/)")
    print(f"{'rule':<7}{'TP':>4}{'FP':>4}{'FN':>4}  precision  recall")
    for code in RULES:
        tp = sum(1 for k in true_pos if k[2] == code)
        fp = sum(1 for k in false_pos if k[2] == code)
        fn = sum(1 for k in false_neg if k[2] == code)
        precision = tp / (tp + fp) if tp + fp else 1.0
        recall = tp / (tp + fn) if tp + fn else 1.0
        print(f"{code:<7}{tp:>4}{fp:>4}{fn:>4}  {precision:9.0%}  {recall:6.0%}")
    precision = len(true_pos) / max(1, len(got))
    recall = len(true_pos) / max(1, len(expected))
    print(
        f"{'all':<7}{len(true_pos):>4}{len(false_pos):>4}{len(false_neg):>4}  "
        f"{precision:9.0%}  {recall:6.0%}"
    )
    assert not false_pos, "false positives:\n" + "\n".join(map(str, sorted(false_pos)))
    assert not false_neg, "missed:\n" + "\n".join(map(str, sorted(false_neg)))
    assert precision == recall == 1.0


def test_every_rule_has_two_true_positives_in_different_files() -> None:
    files_per_rule: dict[str, set[str]] = {code: set() for code in RULES}
    for path, _, code in _expected(collect_files([BAD])):
        files_per_rule[code].add(path)
    thin = {code: len(files) for code, files in files_per_rule.items() if len(files) < 2}
    assert not thin, f"rules with fewer than two bad scripts: {thin}"


def test_good_corpus_holds_the_guides_snippets_of_every_guide() -> None:
    names = [p.name for p in GOOD.glob("guide_*.py")]
    for prefix in (
        "guide_dist_",
        "guide_amp_",
        "guide_tutorial_",
        "guide_strategies_",
        "guide_patterns_",
        "guide_multigpu_",
    ):
        assert any(n.startswith(prefix) for n in names), prefix
    assert len(names) >= 25
    assert all("Guide:" in (GOOD / n).read_text().splitlines()[0] for n in names)


def test_examples_lint_clean() -> None:
    findings, files = lint_paths([EXAMPLES])
    assert files >= 2
    assert findings == [], format_text(findings, files)


# --- rules, explanations, selection ------------------------------------------------------


def test_rule_catalogue_is_complete() -> None:
    assert list(RULES) == [f"GT{n:03d}" for n in range(1, len(RULES) + 1)]
    assert len(RULES) >= 15
    for code, rule in RULES.items():
        text = explain(code)
        assert text.startswith(f"{code} {rule.name}: {rule.message}")
        assert "Fix: " in text and "Guide: " in text
        assert all(guide in GUIDES for guide, _ in rule.cites)
        assert "\n" not in rule.message and len(rule.message) < 100
    with pytest.raises(KeyError, match="GT001"):
        explain("GT999")


def test_follows_names_through_assignments_and_with_blocks() -> None:
    source = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from gpu_training.checkpoint import CheckpointManager

def run(model, ctx):
    net = model
    net = DDP(net)
    alias = net
    state = {"model": alias.state_dict()}
    if ctx.is_main_process:
        torch.save(state, "x.pt")
    with CheckpointManager("ckpt", ctx=ctx) as ckpt:
        if ctx.rank == 0:
            ckpt.save(state, step=1)
        ckpt.save(state, step=2)
"""
    got = [(f.line, f.code) for f in lint_source(source)]
    assert got == [(10, "GT006"), (15, "GT009")]


def test_noqa_select_ignore() -> None:
    source = (
        "import torch\n"
        "a = torch.nn.DataParallel(m)  # noqa: GT001\n"
        "b = torch.nn.DataParallel(m)  # noqa\n"
        "c = torch.nn.DataParallel(m)  # noqa: GT003\n"
        "d = torch.nn.DataParallel(m)\n"
    )
    assert [f.line for f in lint_source(source)] == [4, 5]
    assert lint_source(source, select=["GT00"], ignore=["GT001"]) == []
    assert [f.line for f in lint_source(source, select=["gt001"])] == [4, 5]
    assert select_rules(["ALL"], ["GT01"]) == {f"GT00{n}" for n in range(1, 10)}
    with pytest.raises(LintError, match="--ignore: unknown rule code 'XY1'"):
        select_rules(None, ["XY1"])


def test_cli_text_json_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    target = str(BAD / "no_destroy.py")
    assert main(["lint", target]) == 1
    out = capsys.readouterr().out
    assert f"{target}:8:5: GT015 process group created but never destroyed" in out
    assert main(["lint", "--format", "json", target, str(BAD / "shuffle_with_sampler.py")]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert Counter(r["code"] for r in rows) == {"GT015": 1, "GT004": 3}
    assert all(r["fix"] and r["line"] > 0 and r["col"] > 0 for r in rows)
    assert main(["lint", "--ignore", "GT015", target]) == 0
    assert "No problems found in 1 file." in capsys.readouterr().out
    assert main(["lint", "--explain", "gt012"]) == 0
    assert "65,536" in capsys.readouterr().out
    assert main(["lint", "--list-rules"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(RULES)


# --- bad input ------------------------------------------------------------------------------


def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.py"
    assert main(["lint", str(missing)]) == 2
    _one_error_line(capsys.readouterr().err, str(missing), "no such file or directory")

    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    assert main(["lint", str(notes)]) == 2
    _one_error_line(capsys.readouterr().err, "notes.txt", "not a Python file")

    binary = tmp_path / "blob.py"
    binary.write_bytes(b"\x00\x01\x02 not text")
    assert main(["lint", str(binary)]) == 2
    _one_error_line(capsys.readouterr().err, "blob.py", "not a Python source file")

    broken = tmp_path / "broken.py"
    broken.write_text("import torch\ndef main(:\n    pass\n")
    good = tmp_path / "good.py"
    good.write_text("print('fine')\n")
    assert main(["lint", str(good), str(broken)]) == 2
    captured = capsys.readouterr()
    _one_error_line(captured.err, "broken.py:2:", "syntax error")
    assert captured.out == ""  # nothing reported when any input is bad

    for argv in (["lint"], ["lint", "--select", "GT9", str(good)], ["lint", "--explain", "X"]):
        assert main(argv) == 2
        _one_error_line(capsys.readouterr().err)


def test_never_crashes_on_valid_python() -> None:
    """The repository and a slice of the standard library: odd but valid Python everywhere."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sample = sorted(stdlib.glob("*.py"))[::10] + sorted((stdlib / "asyncio").glob("*.py"))[::3]
    paths = [REPO_ROOT / "src", REPO_ROOT / "examples", *REPO_ROOT.glob("tests/*.py"), *sample]
    checked = 0
    for path in collect_files([p for p in paths if p.exists()]):
        try:
            source = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        try:
            compile(source, str(path), "exec", dont_inherit=True, flags=0x400)  # ast only
        except SyntaxError:
            continue  # not valid Python for this interpreter: out of scope
        lint_source(source, str(path))
        checked += 1
    assert checked > 80
    odd = (
        """
async def f(xs):
    async with ctx() as (a, b):
        async for x in xs:
            match x:
                case {"k": [1, *rest]} if rest:
                    yield (y := x)
                case _:
                    pass
    lambda *a, **k: print(*a, **k)
    global_ = [i for i in range(3) if (j := i)]
    del global_[0]
    try:
        raise
    except* ValueError:
        pass
"""
        if sys.version_info >= (3, 11)
        else "x = 1\n"
    )
    lint_source(odd)


def test_lint_imports_no_torch() -> None:
    code = (
        "import sys\nfrom gpu_training.cli import main\n"
        f"rc = main(['lint', {str(EXAMPLES)!r}])\n"
        "assert 'torch' not in sys.modules, 'lint imported torch'\nsys.exit(rc)\n"
    )
    proc = run_python(["-c", code], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
