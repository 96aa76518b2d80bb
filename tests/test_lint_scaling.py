"""Walks of ``lint`` that were exponential in real repositories, bounded (issue 33).

Counted in calls, not timed: a name rebound many times (set 18's instruction-tuning script
took over 600 s of CPU in ``rank_in_value``), a project with many same-named classes (set 9's
vendored guided-diffusion: 381 s in the overridden-methods scan), and the two walks of the same
shape found after them: what a value is (``ModuleFacts.kinds``) and whether a path is private to
the process (``temp_paths.private_temp_path``; a file with thirty rebinds of one path took
minutes, 0.3 s since).
"""

from __future__ import annotations

import ast
import contextlib
from typing import Any

import pytest

from gpu_training.diagnostics.lint import overridden_methods as om
from gpu_training.diagnostics.lint import rank_values, temp_paths
from gpu_training.diagnostics.lint.answers import uncached
from gpu_training.diagnostics.lint.model import ModuleFacts
from gpu_training.diagnostics.lint.project import Project


def _counted(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    """Count the calls of ``owner.name`` (a function, or a method of a class): ``[n]``."""
    inner = getattr(owner, name)
    calls = [0]

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return inner(*args)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_a_name_rebound_many_times_is_followed_once_per_binding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _counted(monkeypatch, rank_values, "_names_with_rank")
    lines = ["p = 'a'"] + [f"if flag{i}:\n    p = p + '{i}'" for i in range(30)]
    lines += ["q = p + '.log'", "r = f'{q}-{rank}'"]
    facts = ModuleFacts(ast.parse("\n".join(lines) + "\n"))
    read = ast.parse("q", mode="eval").body
    assert not rank_values.rank_in_value(facts, read, facts.module_scope)
    assert calls[0] < 32 * 8  # each binding once per depth; unbounded, 31**6 calls
    read = ast.parse("r", mode="eval").body
    assert rank_values.rank_in_value(facts, read, facts.module_scope)


def test_same_named_classes_walk_their_ancestors_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counted(monkeypatch, om._Classes, "parents")
    project = Project()
    for copy in range(6):  # six vendored copies of one class hierarchy
        chain = "class Block:\n    pass\n" + "".join(
            f"class Level{i}({'Block' if i == 0 else f'Level{i - 1}'}):\n    pass\n"
            for i in range(8)
        )
        project.add(f"copy{copy}/model.py", ast.parse(chain))
    assert om.single_process_methods(project) == {}
    assert calls[0] < 6 * 9 * 9  # each class's levels once; unbounded, 6**7 per class


def _thirty_rebinds(last: str) -> ModuleFacts:
    lines = ["import tempfile", "p = 'out'"]
    lines += [f"if flag{i}:\n    p = p + '{i}'" for i in range(30)]
    return ModuleFacts(ast.parse("\n".join([*lines, last]) + "\n"))


def test_a_path_rebound_many_times_is_followed_once_per_binding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _counted(monkeypatch, temp_paths, "_names_with_temp")
    facts = _thirty_rebinds("q = p + '.log'")
    read = ast.parse("q", mode="eval").body
    assert not temp_paths.private_temp_path(facts, read, facts.module_scope)
    assert calls[0] < 32 * 6  # each binding once per depth; unbounded, 31**4 calls
    facts = _thirty_rebinds("t = tempfile.mkdtemp()\np = t + p")
    read = ast.parse("p + '.log'", mode="eval").body
    assert temp_paths.private_temp_path(facts, read, facts.module_scope)


@pytest.mark.parametrize("summarising", [False, True])
def test_what_a_value_is_is_asked_once_per_binding(
    monkeypatch: pytest.MonkeyPatch, summarising: bool
) -> None:
    calls = _counted(monkeypatch, ModuleFacts, "_kinds")
    source = "n = 1\n" + "n = n * n + n * n\n" * 30 + "m = 2 + 3\nm = m * m\n"
    facts = ModuleFacts(ast.parse(source))
    read = ast.parse("n", mode="eval").body
    with uncached() if summarising else contextlib.nullcontext():
        assert facts.kinds(read, facts.module_scope) == frozenset()  # past the depth bound
        assert calls[0] < 60  # each value once per depth; without kept answers, 596 calls
        read = ast.parse("m", mode="eval").body
        assert facts.kinds(read, facts.module_scope) == {"number"}
    assert bool(facts.memo) is not summarising  # kept in the summary's scratch, not the module
