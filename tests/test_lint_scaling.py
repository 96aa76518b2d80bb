"""Two walks of ``lint`` that were exponential in real repositories, bounded (issue 33).

Counted in calls, not timed: a name rebound many times (set 18's instruction-tuning script
took over 600 s of CPU in ``rank_in_value``), and a project with many same-named classes
(set 9's vendored guided-diffusion: 381 s in the overridden-methods scan). Other walks of the
same shape are not bounded yet (``ModuleFacts.kinds``, ``temp_paths.private_temp_path``: a
whole file with thirty rebinds of one path still takes minutes).
"""

from __future__ import annotations

import ast

import pytest

from gpu_training.diagnostics.lint import overridden_methods as om
from gpu_training.diagnostics.lint import rank_values
from gpu_training.diagnostics.lint.model import ModuleFacts
from gpu_training.diagnostics.lint.project import Project


def test_a_name_rebound_many_times_is_followed_once_per_binding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = 0
    inner = rank_values._names_with_rank

    def counted(*args: object) -> bool:
        nonlocal calls
        calls += 1
        return inner(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(rank_values, "_names_with_rank", counted)
    lines = ["p = 'a'"] + [f"if flag{i}:\n    p = p + '{i}'" for i in range(30)]
    lines += ["q = p + '.log'", "r = f'{q}-{rank}'"]
    facts = ModuleFacts(ast.parse("\n".join(lines) + "\n"))
    read = ast.parse("q", mode="eval").body
    assert not rank_values.rank_in_value(facts, read, facts.module_scope)
    assert calls < 32 * 8  # each binding once per depth; unbounded, 31**6 calls
    read = ast.parse("r", mode="eval").body
    assert rank_values.rank_in_value(facts, read, facts.module_scope)


def test_same_named_classes_walk_their_ancestors_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    inner = om._Classes.parents

    def counted(self: om._Classes, cls: ast.ClassDef) -> list[ast.ClassDef]:
        nonlocal calls
        calls += 1
        return inner(self, cls)

    monkeypatch.setattr(om._Classes, "parents", counted)
    project = Project()
    for copy in range(6):  # six vendored copies of one class hierarchy
        chain = "class Block:\n    pass\n" + "".join(
            f"class Level{i}({'Block' if i == 0 else f'Level{i - 1}'}):\n    pass\n"
            for i in range(8)
        )
        project.add(f"copy{copy}/model.py", ast.parse(chain))
    assert om.single_process_methods(project) == {}
    assert calls < 6 * 9 * 9  # each class's levels once; unbounded, 6**7 per class
