"""``gpu-training lint`` keeps smaller syntax trees, and no rule notices.

A whole-repository run keeps every module's tree at once: on diffusers the trees were 1.05 of
the run's 2.07 GB (benchmarks/README.md, "A whole-repository run of a large tree"). Right after
a module is parsed, :func:`~gpu_training.diagnostics.lint.positions.compact` drops the end
position of the expressions no rule reads it of, and shares one int per line number. Checked
here: what the rules read is kept, the trees take less memory, and the whole lint corpus gives
the same findings, hygiene rules included, with the compaction switched off.
"""

from __future__ import annotations

import ast
import tracemalloc
from pathlib import Path

import pytest

import gpu_training.diagnostics.lint.model as lint_model
from gpu_training.diagnostics.lint import lint_paths
from gpu_training.diagnostics.lint.model import ModuleFacts
from gpu_training.diagnostics.lint.positions import ENDLESS, compact

CORPUS = Path(__file__).parent / "lint_corpus"

_SOURCE = """\
import torch.distributed as dist

def train(model, loader):
    with torch.no_grad():
        for batch in loader:
            if (n := len(batch)) > 2:
                loss = model(batch).sum()
    try:
        dist.barrier()
    except RuntimeError as err:
        print(err)
    return [x for x in loader if x]
"""


def _positions(tree: ast.AST) -> list[tuple[str, object, object, object, object]]:
    fields = ("lineno", "col_offset", "end_lineno", "end_col_offset")
    return [
        (type(n).__name__, *(getattr(n, name) for name in fields))
        for n in ast.walk(tree)
        if "lineno" in n.__dict__
    ]


def test_what_the_rules_read_is_kept() -> None:
    before = _positions(ast.parse(_SOURCE))
    tree = ast.parse(_SOURCE)
    ModuleFacts(tree)  # compacts its module, as every module the lint adds
    after = _positions(tree)
    assert [row[:3] for row in after] == [row[:3] for row in before]  # every start stays
    kept = {name for name, *_ in before} - {k.__name__ for k in ENDLESS}
    assert {"With", "For", "If", "Try", "ExceptHandler", "NamedExpr", "Return"} <= kept
    for old, new in zip(before, after, strict=True):
        if old[0] in kept:
            assert new == old  # statements, handlers and `:=` keep their ends
        else:
            assert new[3:] == (None, None), new  # the class default: no end


def test_line_numbers_are_shared() -> None:
    source = "\n" * 400 + "y = f(a, b) + g(c)\n"
    tree = ast.parse(source)
    nodes = list(ast.walk(tree))
    compact(nodes)
    lines = [n.__dict__["lineno"] for n in nodes if "lineno" in n.__dict__]
    assert lines == [401] * len(lines) and len(lines) > 5
    assert len({id(line) for line in lines}) == 1


def test_compacted_trees_take_less_memory() -> None:
    source = "".join(
        f"value_{i} = helper(first[{i}], key=second.attr_{i}) + other({i}, 'text')\n"
        for i in range(300, 2300)
    )
    tracemalloc.start()
    try:
        tree = ast.parse(source)
        parsed, _ = tracemalloc.get_traced_memory()
        compact(list(ast.walk(tree)))
        compacted, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert compacted < 0.8 * parsed, (parsed, compacted)


def test_the_corpus_finds_the_same_without_compaction(monkeypatch: pytest.MonkeyPatch) -> None:
    compacted = lint_paths([CORPUS], include_tests=True, hygiene=True)
    monkeypatch.setattr(lint_model, "compact", lambda nodes: None)
    whole = lint_paths([CORPUS], include_tests=True, hygiene=True)
    assert compacted.files == whole.files > 300
    assert compacted.findings == whole.findings
    assert len(whole.findings) > 200
