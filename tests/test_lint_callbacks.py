"""``gpu-training lint``: a function of another module handed on as a callback.

``signal.signal(SIGTERM, functools.partial(on_term, out_dir=d))``, ``atexit.register(flush)``
and ``threading.Thread(target=dump)`` run the function later in the process that handed it
on: registered on every rank, its write is every rank's (``GT007`` in the function);
registered under a rank-0 guard, rank 0's alone. Minimal reproductions written here
(issue 33, set 13: a SIGTERM handler that touches a status file, installed on every rank).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_HANDLERS = """\
import os


def on_term(signum, frame, out_dir="out"):
    marker = os.path.join(out_dir, "STATUS.FAILED")
    open(marker, "a").close()
    os._exit(0)


def flush(rows):
    with open("metrics.csv", "a") as f:
        f.writelines(rows)
"""

_REGISTRATIONS = {
    "signal_partial": (
        "import functools\nimport signal\n",
        "    signal.signal(signal.SIGTERM, functools.partial(on_term, out_dir='out'))\n",
        6,
    ),
    "signal_direct": ("import signal\n", "    signal.signal(signal.SIGINT, on_term)\n", 6),
    "atexit": ("import atexit\n", "    atexit.register(flush, rows)\n", 11),
    "thread": (
        "import threading\n",
        "    threading.Thread(target=flush, args=(rows,)).start()\n",
        11,
    ),
}

_SCRIPT = """\
{imports}
import torch.distributed as dist

from handlers import flush, on_term


def main(rows):
    dist.init_process_group("nccl")
{guard}{register}    dist.barrier()
"""


def _gt007(tmp_path: Path, case: str, guard: str) -> set[tuple[str, int]]:
    imports, register, _ = _REGISTRATIONS[case]
    if guard:
        register = "    " + register
    (tmp_path / ".git").mkdir()
    (tmp_path / "handlers.py").write_text(_HANDLERS)
    script = _SCRIPT.format(imports=imports, guard=guard, register=register)
    (tmp_path / "train.py").write_text(script)
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return {(Path(f.path).name, f.line) for f in report.findings if f.code == "GT007"}


@pytest.mark.parametrize("case", sorted(_REGISTRATIONS))
def test_a_callback_registered_on_every_rank_writes_on_every_rank(
    tmp_path: Path, case: str
) -> None:
    assert ("handlers.py", _REGISTRATIONS[case][2]) in _gt007(tmp_path, case, "")


@pytest.mark.parametrize("case", sorted(_REGISTRATIONS))
def test_a_callback_registered_on_rank0_writes_once(tmp_path: Path, case: str) -> None:
    assert _gt007(tmp_path, case, "    if dist.get_rank() == 0:\n") == set()
