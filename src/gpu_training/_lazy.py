"""Lazy exports for a package: names resolve to their submodule on first access (PEP 562).

The package's ``__init__`` lists ``public name -> submodule`` and gets its ``__getattr__``
and ``__dir__`` from :func:`lazy_exports`, so that importing the package (``gpu-training
--help``, ``lint``, ``doctor``, ``config check``) does not pay for ``import torch``::

    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)

No torch here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], public: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``.

    ``exports`` maps each public name to the module that defines it, relative to
    ``package``: a submodule (``"lint"``), or with a leading dot a module beside the package
    (``".watchdog"`` from ``gpu_training.diagnostics`` is ``gpu_training.watchdog``);
    ``public`` is what ``dir(package)`` lists (its ``__all__``). A resolved name is cached in
    the package's namespace, so later lookups do not come back here.
    """
    names = sorted(public)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return list(names)

    return __getattr__, __dir__
