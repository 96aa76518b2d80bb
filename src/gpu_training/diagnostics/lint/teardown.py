"""``GT015``: which script creates the process group, and whether anything destroys it.

The group is the responsibility of the script that runs: the code its module level reaches
(``if __name__ == "__main__": main()``, the functions it hands to ``mp.spawn``). A helper module
whose functions only other files call (``util/misc.py``'s ``init_distributed_mode``) is not the
one to blame; the training script that calls it is, with the helper named in the evidence.
Fragments are left alone: a file that neither trains nor, as a script, talks to the other
ranks (a guide's set-up snippet).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> from gpu_training.diagnostics.lint.ranks import RankAnalysis
    >>> tree = ast.parse("import torch.distributed as dist\\n"
    ...                  "def main():\\n    dist.init_process_group('nccl')\\n    loss.backward()\\n"
    ...                  "main()\\n")
    >>> facts = ModuleFacts(tree)
    >>> inits = [tree.body[1].body[0].value]
    >>> ranks = RankAnalysis(facts, distributed=True)
    >>> missing_destroy(facts, inits, trains=True, summaries=[], ranks=ranks)[1]
    'init_process_group (line 3); nothing here calls destroy_process_group()'
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import has_main_block, node_start, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name
from gpu_training.diagnostics.lint.ranks import RankAnalysis
from gpu_training.diagnostics.lint.summary import Summary

__all__ = ["creates_plain_group", "missing_destroy", "reached_from_module"]

_MADE = ("init_process_group", "init_distributed")
_FRAMEWORK_STATES = ("Accelerator (", "PartialState (")


def missing_destroy(
    facts: ModuleFacts,
    inits: list[ast.Call],
    *,
    trains: bool,
    summaries: list[Summary],
    ranks: RankAnalysis,
    helper_module: bool = False,
) -> tuple[ast.Call, str] | None:
    """Where the script's entry creates a group nothing destroys, with the evidence.

    Args:
        facts: The file's facts.
        inits: Its direct ``init_process_group``/``init_distributed`` calls.
        trains: Whether it (or a helper it calls) runs a training step.
        summaries: What the project helpers it calls do.
        ranks: Its collectives.
        helper_module: Other linted files call its functions.

    Returns:
        ``(the creating call, evidence)``, or None.
    """
    calls = facts.calls
    script = has_main_block(facts.tree)
    if not trains and not (script and _talks_to_other_ranks(facts, calls, summaries, ranks)):
        return None  # a set-up fragment: nothing here trains, or a snippet that is never run
    tails = {tail(call_name(c, facts.imports)) for c in calls}
    if tails & {"destroy_process_group", "cleanup_distributed"}:
        return None
    if any(s.destroys_group for s in summaries):
        return None
    creators: list[tuple[ast.Call, str]] = []
    for scope_node in reached_from_module(facts, helper_module):
        for node in facts.scope_nodes.get(scope_node, []):
            if not isinstance(node, ast.Call):
                continue
            if node in inits:
                creators.append(
                    (node, f"{tail(call_name(node, facts.imports))} (line {node.lineno})")
                )
                continue
            for callee, func in facts.callees(node):
                summary = facts.resolver.summary((callee, func)) if facts.resolver else None
                made = summary.creates_group if summary is not None else None
                innermost = (made or "").rsplit("which calls ", 1)[-1]
                if innermost.startswith(_FRAMEWORK_STATES):
                    continue  # an Accelerator joins and tears down the group itself
                if callee is not facts and summary is not None and summary.creates_group:
                    creators.append((node, f"{summary.where} creates it: {summary.creates_group}"))
                    break
    if not creators:
        return None
    call, where = min(creators, key=lambda item: node_start(item[0]))
    return call, f"{where}; nothing here calls destroy_process_group()"


def _talks_to_other_ranks(
    facts: ModuleFacts, calls: list[ast.Call], summaries: list[Summary], ranks: RankAnalysis
) -> bool:
    """A collective beyond creating the group (a sampling script's ``all_gather``)."""
    if any(s.collective and not s.collective.startswith(_MADE) for s in summaries):
        return True
    for call in calls:
        found = ranks.collective(call, facts.module_scope)
        if found and not found.startswith(_MADE) and "which calls init_" not in found:
            return True
    return False


def reached_from_module(facts: ModuleFacts, helper_module: bool = False) -> set[ast.AST]:
    """The scopes the module-level code runs (calls, functions passed as values).

    Args:
        facts: The file's facts.
        helper_module: Other linted files call its functions.

    Returns:
        Those scopes; when the module level runs none, every scope (a snippet) or, for a
        helper module, none (the files that call it are the entries).
    """
    module = facts.tree
    calls: dict[ast.AST, set[ast.AST]] = {}
    for node in facts.scopes:
        found: set[ast.AST] = set()
        for sub in facts.scope_nodes.get(node, []):
            if isinstance(sub, ast.Call):
                found.update(facts.local_functions(sub))
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                found.update(facts.functions.get(sub.id, []))
        calls[node] = found
    if not calls.get(module):
        return set() if helper_module else set(facts.scopes)
    reached: set[ast.AST] = {module}
    todo: list[ast.AST] = [module]
    while todo:
        for callee in calls.get(todo.pop(), set()):
            if callee not in reached:
                reached.add(callee)
                todo.append(callee)
    return reached


def creates_plain_group(call: ast.Call, facts: ModuleFacts) -> bool:
    """``init_process_group(...)``, or a function of the project that calls it (an
    ``AdvancedTrainer(model, ...)`` whose ``__init__`` creates the group): a group that
    pins no device (``deepspeed.init_distributed`` and the toolkit's own do)."""
    if tail(call_name(call, facts.imports)) == "init_process_group":
        return True
    return any(
        (s.creates_group or "").startswith("init_process_group (") for s in facts.summaries(call)
    )
