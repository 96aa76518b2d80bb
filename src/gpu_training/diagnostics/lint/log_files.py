"""A log file a ``logging.FileHandler`` opens for writing (``GT007``/``GT017``).

``logging.FileHandler(path)`` opens ``path`` in append mode: every process that creates one
adds its lines to the file, interleaved - a logging matter, not a file clobbered. With
``mode="w"`` each handler empties the file as it opens it, so a second process (another rank,
or local rank 0 of another node) truncates what the first one wrote: a shared file written by
several processes, as ``open(path, "w")`` is.

Example:
    >>> import ast
    >>> call = ast.parse("logging.FileHandler(log_dir + 'train.log', 'w')", mode="eval").body
    >>> ast.unparse(truncated_log_file(call))
    "log_dir + 'train.log'"
    >>> truncated_log_file(ast.parse("logging.FileHandler('train.log')", mode="eval").body)
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import call_arg

__all__ = ["truncated_log_file"]


def truncated_log_file(call: ast.Call) -> ast.expr | None:
    """The path a ``logging.FileHandler(filename, mode, ...)`` call empties and writes, or
    None when it only appends (the default mode ``"a"``, or a mode not written literally)."""
    mode = call_arg(call, 1, "mode")
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and "w" in mode.value:
        return call_arg(call, 0, "filename")
    return None
