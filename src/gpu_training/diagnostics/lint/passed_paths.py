"""Where a path parameter comes from: what every caller passes, and command-line defaults.

A vendored data utility writes its cache under ``if local_rank <= 0:`` to
``f"{output_path}/traindata_{key}.pt"``; ``output_path`` is a parameter, and the one script
calling it passes ``args.data_output_path``, an option whose default is
``/tmp/data_files/``: storage of the node's own, where one writer per node is the intended
pattern (``GT017`` does not apply). So a path is followed:

* from a parameter to the values every call of its function passes, in any linted module of
  the project (at least one call; the function not handed on as a value);
* from an ``args.<name>`` read to the ``default=`` of the ``add_argument("--<name>", ...)`` (or
  ``dest="<name>"``) of the same module.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("import argparse\\np = argparse.ArgumentParser()\\n"
    ...        "p.add_argument('--cache_dir', default='/tmp/cache')\\nargs = p.parse_args()\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> ast.unparse(option_default(facts, "cache_dir"))
    "'/tmp/cache'"
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import call_arg, keyword_arg, parameter_index
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope

__all__ = ["option_default", "option_name", "passed_values"]


def option_default(facts: ModuleFacts, name: str) -> ast.expr | None:
    """The ``default=`` of the module's command-line option stored as ``name``, or None (no
    such option, several, or no default)."""
    found: list[ast.expr] = []
    for node in facts.nodes:
        if isinstance(node, ast.Call) and option_name(node) == name:
            default = keyword_arg(node, "default")
            if default is None:
                return None
            found.append(default)
    return found[0] if len(found) == 1 else None


def option_name(call: ast.Call) -> str | None:
    """The name an ``add_argument(...)`` call stores its option as (``dest=``, else the first
    long flag with ``-`` read as ``_``: ``--grad-accum`` -> ``grad_accum``); None for any other
    call, or an option with no long flag."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
        return None
    dest = keyword_arg(call, "dest")
    if isinstance(dest, ast.Constant) and isinstance(dest.value, str):
        return dest.value
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return next((f.lstrip("-").replace("-", "_") for f in flags if f.startswith("--")), None)


def passed_values(
    facts: ModuleFacts, name: str, scope: Scope
) -> list[tuple[ModuleFacts, ast.expr, Scope]] | None:
    """What every call of the function that has ``name`` as a parameter passes for it, across
    the linted modules: ``(module, value, where)``; None when the scope is no function with
    that parameter, a call leaves it out, or nothing calls the function."""
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]]
    if name not in params:
        return None
    index = parameter_index(func, name)
    found: list[tuple[ModuleFacts, ast.expr, Scope]] = []
    modules = list(getattr(facts.resolver, "linted", {}).values()) or [facts]
    for module in modules:
        for call in module.calls:
            if not any(ref[1] is func for ref in module.callees(call)):
                continue
            value = call_arg(call, index, name)
            if value is None:
                return None
            found.append((module, value, module.scope_containing(call)))
    return found or None
