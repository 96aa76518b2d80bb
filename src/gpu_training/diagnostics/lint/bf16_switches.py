"""A ``GradScaler`` switched on by the bf16 setting itself (``GT011``).

``GradScaler(enabled=(dtype == "bfloat16"))`` inverts the usual switch (``enabled=(dtype ==
"float16")``): the scaler runs exactly in the runs that autocast to bfloat16, which need no loss
scaling, and stays off for float16, which does. What the autocast's dtype is does not matter
then (it is often read from a config at run time): whenever the scaler works, the run is bf16.

The ``enabled`` value is read as the condition it is: a comparison ``==``/``is`` with a bf16
spelling (``"bfloat16"``, ``"bf16"``, ``"bf16-mixed"``, ``torch.bfloat16``), membership in a
literal collection of such spellings, a flag named for bf16 (``args.bf16``, ``use_bf16``,
``cfg.train.is_bfloat16``), a conjunction with one such operand (``amp and args.bf16``), or a
name bound only to one of those. ``enabled=(dtype == "float16")``, ``not args.bf16`` and
``dtype != "bfloat16"`` are the right switch or a different one: not reported.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = "import torch\\nscaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'bfloat16'))\\n"
    >>> facts = ModuleFacts(ast.parse(src))
    >>> [(call.lineno, why) for call, why in scalers_enabled_by_bf16(facts.calls, facts)]
    [(2, "enabled=(dtype == 'bfloat16'): the scaler runs exactly when the run is bfloat16")]
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import keyword_arg, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted

__all__ = ["scalers_enabled_by_bf16"]

_SCALERS = frozenset({"GradScaler", "ShardedGradScaler"})
_BF16_TEXT = frozenset(
    {"bfloat16", "bf16", "bf16-mixed", "bf16-true", "bf16_mixed", "torch.bfloat16"}
)
_FLAG_PREFIXES = ("use_", "is_", "enable_", "with_")
_MAX_DEPTH = 3


def scalers_enabled_by_bf16(
    calls: list[ast.Call], facts: ModuleFacts
) -> list[tuple[ast.Call, str]]:
    """The ``GradScaler``/``ShardedGradScaler`` constructions whose ``enabled`` argument is true
    exactly in bf16 runs, each with the reason."""
    found: list[tuple[ast.Call, str]] = []
    for call in calls:
        if tail(call_name(call, facts.imports)) not in _SCALERS:
            continue
        enabled = keyword_arg(call, "enabled")
        if enabled is None:
            continue
        scope = facts.scope_containing(call)
        if _true_only_in_bf16(enabled, facts, scope, 0):
            why = f"enabled={ast.unparse(enabled)}"
            if isinstance(enabled, ast.Compare):
                why = f"enabled=({ast.unparse(enabled)})"
            found.append((call, f"{why}: the scaler runs exactly when the run is bfloat16"))
    return found


def _true_only_in_bf16(expr: ast.expr, facts: ModuleFacts, scope: Scope, depth: int) -> bool:
    """Whether ``expr`` holds only when the run's precision is bfloat16."""
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1:
        op, right = expr.ops[0], expr.comparators[0]
        if isinstance(op, (ast.Eq, ast.Is)):
            return _is_bf16(expr.left, facts) or _is_bf16(right, facts)
        if isinstance(op, ast.In) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            return bool(right.elts) and all(_is_bf16(e, facts) for e in right.elts)
        return False
    if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.And):
        return any(_true_only_in_bf16(v, facts, scope, depth) for v in expr.values)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        last = expr.id if isinstance(expr, ast.Name) else expr.attr
        if _bf16_flag(last):
            return True
        key = dotted(expr)
        if key is None or depth >= _MAX_DEPTH:
            return False
        values = facts.lookup_all(key, scope)
        return bool(values) and all(
            v is not None and _true_only_in_bf16(v, facts, scope, depth + 1) for v in values
        )
    return False


def _bf16_flag(name: str) -> bool:
    """A flag named for bf16: ``bf16``, ``use_bf16``, ``is_bfloat16`` (any case)."""
    lowered = name.lower()
    for prefix in _FLAG_PREFIXES:
        lowered = lowered.removeprefix(prefix)
    return lowered in ("bf16", "bfloat16")


def _is_bf16(expr: ast.expr, facts: ModuleFacts) -> bool:
    """A spelling of the bfloat16 dtype: a string literal or ``torch.bfloat16``."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value.lower() in _BF16_TEXT
    name = dotted(expr)
    return name is not None and facts.imports.resolve(name) == "torch.bfloat16"
