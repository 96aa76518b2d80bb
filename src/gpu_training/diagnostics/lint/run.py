"""Run every check of ``gpu-training lint`` over the files of one project, together.

Files imported by a distributed script run in its processes, so they inherit what it sets up
(the process group, a ``print`` replaced on the other ranks, a DDP model); the call sites one
file has into another's functions decide those functions' contexts (a helper called only
under a rank-0 guard in ``main.py`` is rank-0 code in ``utils.py``). So the files are walked
in rounds: each settles its own functions, the call sites it found into the others are handed
over, and only then does each report.

Example:
    >>> import ast
    >>> source = "import torch\\nmodel = torch.nn.DataParallel(model)\\nloss.backward()\\n"
    >>> [(f.code, f.line) for f in check_tree(ast.parse(source))]
    [('GT001', 2)]
"""

from __future__ import annotations

import ast
import math

from gpu_training.diagnostics.lint.checks import BASE_INHERITED, FileChecker
from gpu_training.diagnostics.lint.class_bases import base_modules
from gpu_training.diagnostics.lint.context import Ctx, RawFinding
from gpu_training.diagnostics.lint.dead_code import dead_spans
from gpu_training.diagnostics.lint.helper_collectives import call_site_collectives
from gpu_training.diagnostics.lint.helper_writes import call_site_writes
from gpu_training.diagnostics.lint.launched_switches import launched_switch_spans
from gpu_training.diagnostics.lint.node_writes import call_site_node_writes
from gpu_training.diagnostics.lint.orphan_modules import orphan_module, unrun_spans
from gpu_training.diagnostics.lint.overridden_methods import GROUP_PREMISED, single_process_methods
from gpu_training.diagnostics.lint.patched_methods import method_sites
from gpu_training.diagnostics.lint.prefix_loaders import prefix_loaders, reading_back
from gpu_training.diagnostics.lint.project import Project
from gpu_training.diagnostics.lint.star_imports import merge_star_imports
from gpu_training.diagnostics.lint.unbound_names import raising_spans
from gpu_training.diagnostics.lint.unimportable import failing_import_line

__all__ = ["RawFinding", "check_project", "check_tree"]


def check_project(project: Project) -> dict[str, list[RawFinding] | str]:
    """Every rule's findings in every linted file of a project.

    Files imported by a distributed script run in its processes, so they inherit what it
    sets up (the process group, a print replaced on the other ranks, a DDP model); the call
    sites one file has into another's functions decide those functions' contexts.

    Args:
        project: The project, with every file to lint added.

    Returns:
        Path → its findings, sorted by position (before ``# noqa`` and ``--select``), or a
        one-line reason when the file could not be analysed (nested too deeply, or a defect
        of the lint's own: :func:`_unanalysed`, so that one file does not stop the run).
    """
    merge_star_imports(project)  # `from utils import *` brings `mp` and `dist` too
    failed: dict[str, str] = {}
    checkers: dict[str, FileChecker] = {}
    for path, facts in project.linted.items():
        try:
            checkers[path] = FileChecker(facts, project)
        except Exception as err:  # reported as the file's error
            failed[path] = _unanalysed(err)
    importers = {
        path: [checkers[f.path] for f in project.importers_of(c.facts) if f.path in checkers]
        for path, c in checkers.items()
    }
    bases = {  # a subclass's file runs its base classes' methods (their loaders, their group)
        path: [checkers[f.path] for f in base_modules(c.facts, project) if f.path in checkers]
        for path, c in checkers.items()
    }
    changed = True
    while changed:
        changed = False
        for path, checker in checkers.items():
            for importer in importers[path]:
                changed = checker.inherit(importer) or changed
            for base in bases[path]:
                changed = checker.inherit(base, BASE_INHERITED) or changed

    project.set_distributed({path for path, c in checkers.items() if c.distributed})

    def guarded(step: str) -> None:
        for path, checker in list(checkers.items()):
            try:
                getattr(checker, step)()
            except Exception as err:  # reported as the file's error
                failed[path] = _unanalysed(err)
                del checkers[path]

    guarded("rebuild_ranks")
    guarded("settle")
    for _ in range(2):  # call sites across files settle the callees' contexts
        incoming: dict[str, dict[int, list[tuple[Ctx, bool]]]] = {p: {} for p in checkers}
        for checker in checkers.values():
            made = [(ref, ctx, every) for ref, ctx, every, _ in checker.outgoing]
            for (facts, func), ctx, every_rank in made + checker.callback_sites:
                if facts.path in incoming:
                    incoming[facts.path].setdefault(id(func), []).append((ctx, every_rank))
        for owner, patched in method_sites(checkers, project).items():  # patched_methods.py
            for key, method_ctxs in patched.items():
                incoming[owner].setdefault(key, []).extend(method_ctxs)
        for path, checker in checkers.items():
            checker.external_sites = incoming[path]
            seeds = {
                func
                for func in checker.facts.scopes
                if any(every for _, every in incoming[path].get(id(func), []))
            }
            if seeds - checker.seeds:
                checker.seeds |= seeds
                checker.rebuild_ranks()
        guarded("settle")
    results: dict[str, list[RawFinding] | str] = dict(failed)
    for path, checker in checkers.items():
        try:
            results[path] = checker.report()
        except Exception as err:  # reported as the file's error
            results[path] = _unanalysed(err)
    read_back = reading_back(prefix_loaders(project.linted.values()), project)
    for path, found in list(results.items()):  # their loaders read the `module.` keys back
        if path in read_back and not isinstance(found, str):
            results[path] = [f for f in found if f.code != "GT006" or "pickled" in f.detail]
    for path, spans in single_process_methods(project).items():  # the subclass overrides them
        kept = results.get(path)
        if kept is not None and not isinstance(kept, str):
            results[path] = [
                f
                for f in kept
                if f.code not in GROUP_PREMISED or not any(a <= f.line <= b for a, b in spans)
            ]
    unrun = _unrun_spans(project, results)
    _drop_unrun(results, unrun)  # a call into code that never runs reports nothing either
    for sites in (
        call_site_writes(checkers, results),
        call_site_node_writes(checkers, results),
        call_site_collectives(checkers, results),
    ):
        for path, extra in sites.items():
            found = results[path]
            if not isinstance(found, str):
                results[path] = sorted({*found, *extra})
    _drop_unrun(results, unrun)
    return results


def _unanalysed(err: Exception) -> str:
    """Why a file could not be analysed: too deep for the recursion, or a defect of the lint
    (named, so that it can be reported; the other files are still linted)."""
    if isinstance(err, RecursionError):
        return "nested too deeply to analyse"
    return f"the lint failed on this file ({type(err).__name__}: {err}): please report it"


def _unrun_spans(
    project: Project, results: dict[str, list[RawFinding] | str]
) -> dict[str, list[tuple[float, float]]]:
    """The lines of each linted file that never run: below a top-level import that fails, the
    functions of a module nothing imports or runs, below a certain ``NameError``, the branches
    every shipped launch switches off, and the functions, classes and methods no running code
    reaches."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for path in results:
        facts = project.linted[path]
        dead = failing_import_line(project, facts)
        if dead is not None:
            spans.setdefault(path, []).append((dead, math.inf))
        elif orphan_module(project, facts):
            spans.setdefault(path, []).extend(unrun_spans(facts))
        spans.setdefault(path, []).extend(raising_spans(facts))
        spans[path].extend(launched_switch_spans(facts))  # `else:` of a switch every run sets
    for path, unreached in dead_spans(project).items():
        spans.setdefault(path, []).extend(unreached)
    return spans


def _drop_unrun(
    results: dict[str, list[RawFinding] | str], unrun: dict[str, list[tuple[float, float]]]
) -> None:
    """Drop the findings on lines that never run."""
    for path, spans in unrun.items():
        found = results.get(path)
        if spans and found is not None and not isinstance(found, str):
            results[path] = [f for f in found if not any(a <= f.line <= b for a, b in spans)]


def check_tree(tree: ast.Module, path: str = "<string>") -> list[RawFinding]:
    """Every rule's findings in one parsed module, alone.

    Args:
        tree: ``ast.parse`` of the file (its expressions lose their end positions:
            :func:`~gpu_training.diagnostics.lint.positions.compact`).
        path: Its path (imports of the project's modules next to it are followed).

    Returns:
        The findings (before ``# noqa`` and ``--select`` filtering).
    """
    project = Project()
    project.add(path, tree)
    found = check_project(project)[path]
    return [] if isinstance(found, str) else found
