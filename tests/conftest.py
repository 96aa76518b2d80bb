"""Shared test fixtures: hardware markers, hermetic environment, process-group leak check.

The markers ``requires_cuda``, ``requires_gpus(n)``, ``multirank`` and ``matrix`` are
declared in pyproject.toml; this file only acts on them.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:  # `from dist_harness import run_ranks` in any import mode
    sys.path.insert(0, _TESTS_DIR)

from dist_harness import find_free_port  # noqa: E402


def _required_gpus(item: pytest.Item) -> int:
    """GPUs the test needs: 0, 1 for ``requires_cuda``, n for ``requires_gpus(n)``."""
    needed = 1 if item.get_closest_marker("requires_cuda") else 0
    for marker in item.iter_markers("requires_gpus"):
        count = marker.args[0] if marker.args else marker.kwargs.get("n")
        if not isinstance(count, int) or count < 1:
            raise pytest.UsageError(f"{item.nodeid}: use @pytest.mark.requires_gpus(n), n >= 1")
        needed = max(needed, count)
    return needed


def _slow_modules_first(items: list[pytest.Item]) -> None:
    """Moves the files holding a test marked ``slow`` to the front, in place.

    pytest-xdist (``make test``) hands whole files to its workers in this order: a long file
    started last would end the run alone on one core. The order within a file, and among the
    files of each kind, stays as collected.
    """
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # a stable sort


def _matrix_only_when_asked(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselects the ``matrix`` tests unless the ``-m`` expression names them, in place.

    The full resume matrix takes longer than the rest of the suite: ``make test`` leaves it
    out whatever its other markers say, ``make test-matrix`` (``-m matrix``) runs it.
    """
    if "matrix" in (config.getoption("markexpr", "") or ""):
        return
    dropped = [item for item in items if item.get_closest_marker("matrix")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not item.get_closest_marker("matrix")]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Runs the slow files first; skips GPU tests on machines without enough CUDA devices;
    leaves the resume matrix out unless asked for."""
    _matrix_only_when_asked(config, items)
    _slow_modules_first(items)
    needs = [(item, _required_gpus(item)) for item in items]
    if not any(needed for _, needed in needs):
        return
    import torch  # lazily: config-only test runs need no torch

    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item, needed in needs:
        if needed > found:
            reason = f"needs {needed} CUDA GPU(s), found {found}"
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session", autouse=True)
def _temp_dir_of_the_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Puts every temporary file of the run, the tests' and their processes', in pytest's
    base temp directory, which keeps the last three runs and prunes older ones.

    Bare torchrun's ``torchelastic_*`` log directories, and those of process trees a test
    kills on purpose, would otherwise pile up in ``/tmp`` (about 25 per ``make test``).
    """
    tmp = tmp_path_factory.getbasetemp() / "tmp"
    tmp.mkdir(exist_ok=True)
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp)  # the processes the tests start inherit it
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    yield
    if saved is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved
    tempfile.tempdir = None


@pytest.fixture(autouse=True)
def _restore_environ() -> Iterator[None]:
    """Restores ``os.environ`` after each test (a leaked RANK would change later tests)."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def _no_leaked_process_group() -> Iterator[None]:
    """Fails a test that leaves a torch.distributed process group initialised."""
    yield
    if "torch.distributed" not in sys.modules:  # never import torch just to check
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # so the next test starts clean
        pytest.fail("test left a torch.distributed process group initialised", pytrace=False)


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free when the test started."""
    return find_free_port()
