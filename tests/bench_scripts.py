"""A script of ``benchmarks/`` loaded as a module, for the tests of its arithmetic and its CLI.

The scripts are not a package: each test file that checks one used to carry its own
``importlib`` loader. One here: the module is registered under its name before it runs
(dataclasses and pickles look their module up in ``sys.modules``), and ``benchmarks/`` is put
on ``sys.path`` so that a script importing its sibling (``bench_loops`` imports
``bench_trainer``) finds it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` executed as the module ``name`` (a fresh copy each call)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
