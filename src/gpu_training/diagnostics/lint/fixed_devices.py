"""A fixed GPU index handed to ``DistributedDataParallel`` (``GT002``).

``DDP(model, device_ids=[0], output_device=0)`` in a script every rank runs points every
rank's replica at GPU 0: the model of rank 1 sits on its own device (or on GPU 0 with the
others), and DDP either refuses the mismatch or runs every replica on one card. It is the
literal ``"cuda:0"`` of the rule in the form DDP takes. Not reported: a file whose every
process group has a literal rank (one process per machine, each copy edited by hand), a file
that makes one literal GPU visible (one process: :mod:`.single_gpu`), and a file that narrows ``CUDA_VISIBLE_DEVICES`` per process to a computed value
(``os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank)``), where device 0 is the process's
own GPU.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = "model = DDP(model, device_ids=[0], output_device=0)\\n"
    >>> facts = ModuleFacts(ast.parse(src))
    >>> [(ast.unparse(e), d) for e, d in fixed_ddp_devices(facts, facts.calls)]
    [('0', 'device_ids=[0] is the same GPU on every rank')]
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import keyword_arg, tail
from gpu_training.diagnostics.lint.group_rank import literal_group_rank
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name, dotted
from gpu_training.diagnostics.lint.single_gpu import one_gpu_per_process

__all__ = ["fixed_ddp_devices"]

_DDP = frozenset({"DistributedDataParallel", "DDP"})


def fixed_ddp_devices(facts: ModuleFacts, calls: list[ast.Call]) -> list[tuple[ast.expr, str]]:
    """Each DDP construction of the file given a literal GPU index: ``(the index, detail)``.

    Args:
        facts: The file's facts.
        calls: Every call of the file.

    Returns:
        One entry per DDP call whose ``device_ids`` holds an integer literal (or, failing
        that, whose ``output_device`` is one); nothing when the file runs one process per
        machine or narrows ``CUDA_VISIBLE_DEVICES`` per process.
    """
    if literal_group_rank(facts) or _narrows_visible_devices(facts) or one_gpu_per_process(facts):
        return []
    found: list[tuple[ast.expr, str]] = []
    for call in calls:
        if tail(call_name(call, facts.imports)) not in _DDP:
            continue
        ids = keyword_arg(call, "device_ids")
        if isinstance(ids, (ast.List, ast.Tuple)) and any(_int_literal(e) for e in ids.elts):
            first = next(e for e in ids.elts if _int_literal(e))
            found.append((first, f"device_ids={ast.unparse(ids)} is the same GPU on every rank"))
            continue
        output = keyword_arg(call, "output_device")
        if output is not None and _int_literal(output):
            found.append(
                (output, f"output_device={ast.unparse(output)} is the same GPU on every rank")
            )
    return found


def _int_literal(expr: ast.expr) -> bool:
    return (
        isinstance(expr, ast.Constant)
        and isinstance(expr.value, int)
        and not isinstance(expr.value, bool)
    )


def _narrows_visible_devices(facts: ModuleFacts) -> bool:
    """``os.environ["CUDA_VISIBLE_DEVICES"] = <a computed value>`` anywhere in the file."""
    for node in facts.nodes:
        if not isinstance(node, ast.Assign) or isinstance(node.value, ast.Constant):
            continue
        for target in node.targets:
            if (
                isinstance(target, ast.Subscript)
                and facts.imports.resolve(dotted(target.value)) == "os.environ"
                and isinstance(target.slice, ast.Constant)
                and target.slice.value == "CUDA_VISIBLE_DEVICES"
            ):
                return True
    return False
