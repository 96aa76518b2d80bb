"""A copy of a launched script is launched the same way.

A repository's shell script starts ``accelerate launch train/fine-tune_on_custom_dataset.py``;
beside it, ``fine-tune_on_hf_dataset.py`` and ``fine-tune_on_custom_dataset_cpu.py`` are the
same script with another data source or device: the same author runs them the same way, so
they run once per process too, and their unguarded ``save_pretrained`` is every rank's write.

A file counts as such a copy when a script in its own directory is started by a launcher of
several processes (:func:`~gpu_training.diagnostics.lint.repo_files.multi_process_launches`)
and most of its lines are that script's: at least :data:`SHARED` of the shorter file's
distinct non-blank lines, the two within a factor two in length. Unrelated scripts of one
directory share their imports and little else.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / ".git").mkdir()
    >>> body = "".join(f"step_{i} = run({i})\\n" for i in range(20))
    >>> _ = (root / "train.py").write_text(body)
    >>> _ = (root / "train_cpu.py").write_text(body + "device = 'cpu'\\n")
    >>> _ = (root / "run.sh").write_text("torchrun --nproc_per_node 2 train.py\\n")
    >>> launched_copy(str(root / "train_cpu.py"))
    True
"""

from __future__ import annotations

import functools
import os

from gpu_training.diagnostics.lint.repo_files import (
    MAX_TEXT_BYTES,
    multi_process_launches,
    repository_of,
)

__all__ = ["SHARED", "launched_copy"]

SHARED = 0.8
"""The share of the shorter file's distinct lines the two must have in common."""


@functools.lru_cache(maxsize=256)
def _lines(path: str) -> frozenset[str]:
    try:
        if os.path.getsize(path) > MAX_TEXT_BYTES:
            return frozenset()
        with open(path, encoding="utf-8", errors="replace") as handle:
            return frozenset(s for line in handle if (s := line.strip()) and not s.startswith("#"))
    except OSError:
        return frozenset()


def launched_copy(path: str) -> bool:
    """Whether the file at ``path`` is a copy of a script its repository launches with several
    processes, in the same directory."""
    path = os.path.abspath(path)
    launched = multi_process_launches(repository_of(path))
    if not launched or os.path.basename(path) in launched:
        return False
    mine = _lines(path)
    if not mine:
        return False
    folder = os.path.dirname(path)
    for name in launched:
        other = os.path.join(folder, name)
        if not os.path.isfile(other):
            continue
        theirs = _lines(other)
        small, large = sorted((len(mine), len(theirs)))
        if small and large <= 2 * small and len(mine & theirs) >= SHARED * small:
            return True
    return False
