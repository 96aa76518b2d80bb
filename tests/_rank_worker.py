"""One rank of :func:`dist_harness.run_ranks`: ``python _rank_worker.py PAYLOAD RESULT_DIR``.

Loads ``(module, qualname, module_file, args)`` from PAYLOAD, calls the function and writes
its pickled return value to ``RESULT_DIR/rank{RANK}.pkl``, or the formatted traceback to
``RESULT_DIR/rank{RANK}.err``. Files are written under a temporary name and renamed, so the
harness never reads half a result.
"""

from __future__ import annotations

import faulthandler
import importlib
import importlib.util
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any


def _import_module(name: str, module_file: str | None) -> ModuleType:
    """Imports ``name``; falls back to its file (pytest may import tests under another path)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        if module_file is None:
            raise
    spec = importlib.util.spec_from_file_location(name, module_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {module_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _resolve(module: str, qualname: str, module_file: str | None) -> Callable[..., Any]:
    obj: Any = _import_module(module, module_file)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    fn: Callable[..., Any] = obj
    return fn


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
    os.replace(tmp, path)


def main() -> int:
    """Runs the payload's function once; returns the process exit code."""
    payload, result_dir = Path(sys.argv[1]), Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    faulthandler.enable()  # a segfault prints the Python stack into this rank's log
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the harness asks on timeout
    try:
        module, qualname, module_file, args = pickle.loads(payload.read_bytes())
        fn = _resolve(module, qualname, module_file)
        result = pickle.dumps(fn(*args))
    except BaseException:  # SystemExit from fn is a failure too: it returned nothing
        _write(result_dir / f"rank{rank}.err", traceback.format_exc().encode())
        return 1
    _write(result_dir / f"rank{rank}.pkl", result)
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
