"""The current GPU used before a library pins the process to its own (``GT002``).

A script a launcher starts once per GPU (``deepspeed --num_gpus=2 train.py``, or one that reads
``LOCAL_RANK``) and that leaves the device choice to a library, ``TrainingArguments`` (its
``__post_init__`` sets up the process group and calls ``set_device(local_rank)``),
``Accelerator()`` or ``deepspeed.initialize(...)`` (its engine calls ``set_device(local_rank)``
and moves the model there), is pinned only from that call on. A model moved to the bare
``"cuda"`` device (``.to("cuda")``, ``.cuda()``) before it, in the same function, lands on
``cuda:0`` in every process: every rank materialises its full copy on the first GPU, which runs
out of memory as the ranks grow, although the library later moves the model to the rank's
GPU. A file that calls ``set_device`` itself is pinned from that call (``GT002``'s other
checks), and a one-process script (nothing launches it several times) has only one GPU to use;
a DeepSpeed script that declares the launcher's ``--local_rank`` argument is written for the
``deepspeed`` launcher, which starts it once per GPU.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("import os\\nrank = int(os.environ['LOCAL_RANK'])\\n"
    ...        "model = Net().to('cuda')\\nargs = TrainingArguments('out')\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> [call.lineno for call in cuda_before_pinning(facts)]
    [3]
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import keyword_arg, tail
from gpu_training.diagnostics.lint.hf_launch import written_for_a_launch
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name

__all__ = ["cuda_before_pinning"]

_PINNING = ("TrainingArguments", "Accelerator")
"""Constructions that pin the process to its GPU (``…TrainingArguments``, ``Accelerator``)."""
_SELF_PINNING = frozenset({"set_device", "set_device_index", "init_distributed"})
_LOCAL_RANK_FLAGS = frozenset({"--local_rank", "--local-rank"})


def cuda_before_pinning(facts: ModuleFacts) -> list[ast.Call]:
    """The bare-``cuda`` placements that run before the library pins a launched process.

    Args:
        facts: The file's facts.

    Returns:
        Each ``.to("cuda")``/``.cuda()`` call placed earlier in a function than that
        function's first ``TrainingArguments(...)``/``Accelerator(...)``, in a file written for
        a launch of several processes that never pins the device itself.
    """
    tails = {tail(call_name(c, facts.imports)) for c in facts.calls}
    engine = any(_deepspeed_engine(c, facts) for c in facts.calls)
    launched = written_for_a_launch(facts) or (engine and _takes_local_rank(facts))
    if tails & _SELF_PINNING or not launched:
        return []
    found: list[ast.Call] = []
    for nodes in facts.scope_nodes.values():
        calls = [n for n in nodes if isinstance(n, ast.Call)]
        pins = [c.lineno for c in calls if _pins(c, facts)]
        if not pins:
            continue
        found += [c for c in calls if c.lineno < min(pins) and _bare_cuda(c)]
    return sorted(found, key=lambda c: (c.lineno, c.col_offset))


def _deepspeed_engine(call: ast.Call, facts: ModuleFacts) -> bool:
    """``deepspeed.initialize(...)``: the engine pins the process to ``local_rank``'s GPU."""
    return call_name(call, facts.imports) == "deepspeed.initialize"


def _pins(call: ast.Call, facts: ModuleFacts) -> bool:
    """A call from which the library has pinned the process to its own GPU."""
    return tail(call_name(call, facts.imports)).endswith(_PINNING) or _deepspeed_engine(call, facts)


def _takes_local_rank(facts: ModuleFacts) -> bool:
    """``parser.add_argument("--local_rank", ...)``: the argument a launcher passes each
    process it starts (``deepspeed``, ``torch.distributed.launch``)."""
    return any(
        isinstance(call.func, ast.Attribute)
        and call.func.attr == "add_argument"
        and any(isinstance(a, ast.Constant) and a.value in _LOCAL_RANK_FLAGS for a in call.args)
        for call in facts.calls
    )


def _bare_cuda(call: ast.Call) -> bool:
    """``x.to("cuda")``, ``x.to(device="cuda")`` or ``x.cuda()``: the current device."""
    if not isinstance(call.func, ast.Attribute):
        return False
    if call.func.attr == "cuda":
        return not call.args and not call.keywords
    if call.func.attr != "to":
        return False
    given = call.args[0] if call.args else keyword_arg(call, "device")
    return isinstance(given, ast.Constant) and given.value == "cuda"
