"""A script that makes exactly one GPU visible to itself: one process by construction (``GT002``).

``os.environ["CUDA_VISIBLE_DEVICES"] = "1"`` written as a literal names the same single GPU for
every process that runs the file. Such a script cannot run as several ranks of a group: NCCL
refuses two ranks on one GPU ("Duplicate GPU detected"), and ``set_device(local_rank)`` fails on
every rank but 0 (there is no device 1 to pin). Its ``"cuda:0"`` is the one GPU it chose, not a
GPU it shares by mistake, so ``GT002`` (the fixed or unpinned device) does not apply, even when
the file calls ``init_distributed`` for a library that expects a group. The value is read where
it is set: a subscript assignment, ``os.environ.update({...})`` / ``update(KEY=...)``,
``os.environ.setdefault`` and ``os.putenv``. A value that names several GPUs (``"0,1"``) or
is computed per process (``str(local_rank)``) says nothing here, nor does one in a file that
picks a GPU per process itself (``set_device(local_rank)``, ``torch.device("cuda", rank)``,
``f"cuda:{rank}"``): that file is written for several ranks, and its literal is a leftover of a
one-GPU run (its fixed ``cuda:0`` elsewhere is still every rank's GPU 0 when launched as such).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> one_visible_gpu(ModuleFacts(ast.parse("os.environ['CUDA_VISIBLE_DEVICES'] = '1'")))
    True
    >>> one_visible_gpu(ModuleFacts(ast.parse("os.environ['CUDA_VISIBLE_DEVICES'] = '0,1'")))
    False
"""

from __future__ import annotations

import ast
import os

from gpu_training.diagnostics.lint.calls import tail
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name, dotted
from gpu_training.diagnostics.lint.repo_files import one_process_per_node, repository_of

__all__ = ["one_gpu_per_process", "one_visible_gpu"]

_VARIABLE = "CUDA_VISIBLE_DEVICES"


def one_gpu_per_process(facts: ModuleFacts) -> bool:
    """The file's processes each have one GPU of their own: :func:`one_visible_gpu`, or the
    repository launches every script one process per node
    (:func:`~gpu_training.diagnostics.lint.repo_files.one_process_per_node`), so a fixed
    ``cuda:0`` is each process's own machine's GPU, not one GPU every rank shares (``GT002``)."""
    cached = facts.memo.get("one-gpu-per-process")  # asked for every call of the file
    if isinstance(cached, bool):
        return cached
    result = one_visible_gpu(facts) or (
        facts.path not in ("", "<string>")
        and one_process_per_node(repository_of(os.path.abspath(facts.path)))
    )
    facts.memo["one-gpu-per-process"] = result
    return result


def one_visible_gpu(facts: ModuleFacts) -> bool:
    """Whether every value the file gives ``CUDA_VISIBLE_DEVICES`` is a literal naming one GPU
    (and it gives at least one). Kept in ``facts.memo``."""
    cached = facts.memo.get("one-visible-gpu")
    if isinstance(cached, bool):
        return cached
    values = [v for node in facts.nodes for v in _visible_values(facts, node)]
    result = (
        bool(values)
        and all(_names_one_gpu(v) for v in values)
        and not _picks_gpu_per_process(facts)
    )
    facts.memo["one-visible-gpu"] = result
    return result


def _picks_gpu_per_process(facts: ModuleFacts) -> bool:
    """``set_device(x)``, ``torch.device("cuda", x)`` or ``f"cuda:{x}"`` with ``x`` computed:
    the file chooses among several GPUs, one per process."""
    for node in facts.nodes:
        if isinstance(node, ast.JoinedStr) and any(
            isinstance(before, ast.Constant) and str(before.value).endswith("cuda:")
            for before, value in zip(node.values, node.values[1:], strict=False)
            if isinstance(value, ast.FormattedValue)
        ):
            return True
    for call in facts.calls:
        last = tail(call_name(call, facts.imports))
        if last == "set_device" and call.args and not isinstance(call.args[0], ast.Constant):
            return True
        if last == "device" and len(call.args) == 2 and not isinstance(call.args[1], ast.Constant):
            return True
    return False


def _visible_values(facts: ModuleFacts, node: ast.AST) -> list[ast.expr]:
    """The values a statement or call gives ``CUDA_VISIBLE_DEVICES``."""
    if isinstance(node, ast.Assign):
        return [node.value] if any(_is_environ_key(facts, t) for t in node.targets) else []
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return []
    owner = facts.imports.resolve(dotted(node.func.value))
    method = node.func.attr
    setter = (owner, method) in (("os", "putenv"), ("os.environ", "setdefault"))
    if setter and len(node.args) == 2 and _is_key(node.args[0]):
        return [node.args[1]]
    if owner == "os.environ" and method == "update":
        found = [k.value for k in node.keywords if k.arg == _VARIABLE]
        for arg in node.args:
            if isinstance(arg, ast.Dict):
                found += [v for k, v in zip(arg.keys, arg.values, strict=True) if _is_key(k)]
        return found
    return []


def _is_environ_key(facts: ModuleFacts, target: ast.expr) -> bool:
    return (
        isinstance(target, ast.Subscript)
        and facts.imports.resolve(dotted(target.value)) == "os.environ"
        and _is_key(target.slice)
    )


def _is_key(expr: ast.expr | None) -> bool:
    return isinstance(expr, ast.Constant) and expr.value == _VARIABLE


def _names_one_gpu(value: ast.expr) -> bool:
    """A literal (``"1"``, ``1``, ``"GPU-8f1c…"``) that lists exactly one device."""
    if isinstance(value, ast.Constant) and isinstance(value.value, int):
        return not isinstance(value.value, bool)
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        return False
    text = value.value.strip()
    return bool(text) and "," not in text and text != "-1"
