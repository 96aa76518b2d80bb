"""Whether the launcher set a variable: a test that is the same in every process of a launch.

``if "RANK" in os.environ and "WORLD_SIZE" in os.environ:`` asks whether the script was started
by a launcher (``torchrun`` sets both for every process it starts, Slurm sets ``SLURM_PROCID``
for every task), not which rank this is: every rank takes the same branch, so a collective
under it is reached by all (``GT009`` does not apply), and ``"RANK" not in os.environ`` is the
single-process test, as ``not dist.is_initialized()`` is.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> test = ast.parse("import os\\n'RANK' in os.environ\\n").body[1].value
    >>> launcher_variable_test(ModuleFacts(ast.parse("import os\\n")), test)
    'multi'
"""

from __future__ import annotations

import ast
import re

from gpu_training.diagnostics.lint.model import ModuleFacts, dotted
from gpu_training.diagnostics.lint.switches import MULTI, SINGLE

__all__ = ["launcher_variable_test"]

_LAUNCHER_VARIABLE = re.compile(r"(^|_)(RANK|WORLD_SIZE|PROCID|LOCALID|NTASKS)$")


def launcher_variable_test(facts: ModuleFacts, test: ast.Compare) -> str | None:
    """``MULTI`` for ``"RANK" in os.environ``, ``SINGLE`` for ``not in``, else None.

    Args:
        facts: The module's facts (its imports).
        test: A one-operator comparison.

    Returns:
        The launch-mode kind of a membership test of a launcher's rank or size variable in
        the environment; None for any other comparison.
    """
    if len(test.ops) != 1 or not isinstance(test.ops[0], (ast.In, ast.NotIn)):
        return None
    key, container = test.left, test.comparators[0]
    if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
        return None
    if not _LAUNCHER_VARIABLE.search(key.value):
        return None
    if isinstance(container, ast.Call) and isinstance(container.func, ast.Attribute):
        container = container.func.value  # `os.environ.keys()`
    if facts.imports.resolve(dotted(container)) != "os.environ":
        return None
    return MULTI if isinstance(test.ops[0], ast.In) else SINGLE
