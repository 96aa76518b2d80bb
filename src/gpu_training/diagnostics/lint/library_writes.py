"""Writes a library call makes for its caller (``GT007``): a download, a config dump.

Two ways of writing a file name neither ``open`` nor ``torch.save``:

* ``datasets.CIFAR10(root="data", download=True)``: a dataset (or a model loader) told to
  download fetches its archive into ``root`` and extracts it there when it is missing. Run
  by every process at once on a fresh machine, the processes write and extract the same
  files together (a truncated archive, a failed checksum). ``download=False``, or a value
  computed at run time (``download=rank == 0``), is not judged here.
* ``OmegaConf.save(cfg, path)``: a module's or class's ``save``/``dump`` function given the
  object and then the path (the ``torch.save`` form) writes that path.

Example:
    >>> import ast
    >>> call = ast.parse("CIFAR10(root='data', train=True, download=True)").body[0].value
    >>> ast.unparse(downloaded_to(call))
    "'data'"
    >>> call = ast.parse("OmegaConf.save(cfg, 'run/config.yaml')").body[0].value
    >>> ast.unparse(saved_to(call, "omegaconf.OmegaConf.save", frozenset({"OmegaConf"})))
    "'run/config.yaml'"
"""

from __future__ import annotations

import ast
from collections.abc import Collection

from gpu_training.diagnostics.lint.calls import call_arg, keyword_arg, tail

__all__ = ["download_target", "downloaded_to", "saved_to"]

_SAVERS = frozenset({"save", "dump"})
_PATH_KEYWORDS = ("f", "file", "path", "filename", "fname")


def downloaded_to(call: ast.Call) -> ast.expr | None:
    """Where a call told ``download=True`` downloads: its ``root`` (or first argument).

    Args:
        call: Any call.

    Returns:
        The root directory expression (the callee itself when no root is passed), or None:
        no literal ``download=True``.
    """
    flag = keyword_arg(call, "download")
    if not (isinstance(flag, ast.Constant) and flag.value is True):
        return None
    for name in ("root", "root_dir", "data_dir", "cache_dir", "path"):
        given = keyword_arg(call, name)
        if given is not None:
            return given
    return call.args[0] if call.args else call.func


def download_target(call: ast.Call, name: str) -> tuple[ast.expr, str] | None:
    """What a download call writes, and how to say it: ``CIFAR10(root, download=True)`` (see
    :func:`downloaded_to`), or ``wandb.restore(name, run_path=...)``, which fetches a run's file
    into the working (or run) directory when it is missing there, or always with
    ``replace=True``: every process that calls it writes the same file.

    Args:
        call: Any call.
        name: Its qualified callee name.
    """
    if name == "wandb.restore":
        restored = call_arg(call, 0, "name")
        return (restored, "wandb.restore (downloads)") if restored is not None else None
    root = downloaded_to(call)
    if root is None:
        return None
    return root, f"{tail(name)}(download=True)"


def saved_to(call: ast.Call, name: str, imported: Collection[str]) -> ast.expr | None:
    """The path a module's or class's ``save(obj, path)`` writes (``OmegaConf.save``).

    Args:
        call: The call.
        name: Its qualified callee name.
        imported: The names the file binds by its imports.

    Returns:
        The path expression, or None: not such a call (a method of an instance, one
        argument only, a library whose second argument is not the path).
    """
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr in _SAVERS):
        return None
    receiver = func.value
    if not (isinstance(receiver, ast.Name) and receiver.id in imported):
        return None  # model.save(...), self.save(...): an instance's own method
    if name.split(".", 1)[0] in ("torch", "numpy", "json", "pickle", "yaml", "tf"):
        return None  # handled where written (torch.save), or given an open handle
    path = call_arg(call, 1, "f")
    for keyword in _PATH_KEYWORDS:
        path = path if path is not None else keyword_arg(call, keyword)
    if path is None or (isinstance(path, ast.Constant) and not isinstance(path.value, str)):
        return None
    return path
