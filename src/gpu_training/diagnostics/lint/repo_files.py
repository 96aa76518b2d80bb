"""The repository's non-Python files that say how its scripts are run.

How a script runs is often written beside it, not in it: an Accelerate config says
``distributed_type: FSDP``; a shell script starts ``deepspeed src/train.py`` or
``torchrun --nproc_per_node 8 train.py``. These helpers find a file's repository and read
those files once per repository (test trees, hidden and vendored directories aside).

Example:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / ".git").mkdir()
    >>> _ = (root / "run.sh").write_text("torchrun --nproc_per_node 4 src/train.py --lr 1e-4\\n")
    >>> multi_process_launches(str(root))
    frozenset({'train.py'})
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

from gpu_training.diagnostics.lint.roots import find_project_root, installed_packages

__all__ = [
    "MAX_TEXT_BYTES",
    "file_paths",
    "multi_process_launches",
    "one_process_per_node",
    "read_files",
    "repository_of",
    "text_files",
]

_SKIP_DIRS = frozenset({"node_modules", "site-packages", "tests", "test", "__pycache__"})
MAX_TEXT_BYTES = 1 << 20
"""The largest file of a repository the lint reads for its text (a launch script, a config)."""
# Launchers that start one process per GPU (`python -m <module>` or a command of their own)
_LAUNCHERS = frozenset(
    {"torchrun", "deepspeed", "torch.distributed.launch", "torch.distributed.run"}
)
# A launcher's "the script is a module" flag (torchrun, accelerate launch, deepspeed), then its name
_MODULE_FLAGS = frozenset({"-m", "--module"})
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_SINGLE = re.compile(r"--(?:nproc_per_node|nproc-per-node|num_gpus|num_processes)[= ]1(?!\d)")


def repository_of(path: str) -> str:
    """The repository holding ``path``: :func:`~gpu_training.diagnostics.lint.roots.find_project_root`
    (the nearest directory above it with ``.git``/``.hg``, else with
    ``pyproject.toml``/``setup.py``/``setup.cfg``), else the file's own directory."""
    return str(find_project_root(path) or Path(path).parent)


def _walked(directory: str) -> bool:
    """Not a test tree, a vendored or hidden directory (``.accelerate``, where Accelerate's
    own config may be kept, aside)."""
    if directory in _SKIP_DIRS:
        return False
    return not directory.startswith(".") or directory == ".accelerate"


@functools.lru_cache(maxsize=64)
def text_files(root: str, suffixes: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``(path, text)`` of every file under ``root`` ending with one of ``suffixes`` (kept:
    for the launch scripts and configs a run asks about again and again)."""
    return tuple(read_files(root, suffixes))


def read_files(root: str, suffixes: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """``(path, text)`` of every file under ``root`` ending with one of ``suffixes``, read one
    at a time and not kept (a scan of every Python file of a large tree)."""
    for name in file_paths(root, suffixes):
        path = Path(name)
        try:
            if path.stat().st_size <= MAX_TEXT_BYTES:
                yield name, path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue


def file_paths(root: str, suffixes: tuple[str, ...]) -> Iterator[str]:
    """The path of every file under ``root`` ending with one of ``suffixes`` (test trees,
    hidden directories and installed packages aside), in a stable order."""
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs if _walked(d) and not installed_packages(Path(directory, d))
        )
        yield from (str(Path(directory, n)) for n in sorted(files) if n.endswith(suffixes))


@functools.lru_cache(maxsize=64)
def multi_process_launches(root: str) -> frozenset[str]:
    """The file names (``train.py``) that the repository's shell scripts start with a launcher
    of one process per GPU (``torchrun``, ``deepspeed``, ``accelerate launch``,
    ``python -m torch.distributed.launch``), unless the command asks for one process; a
    module the launcher runs (``torchrun -m scripts.train``) names its file (``train.py``)."""
    names: set[str] = set()
    for _, text in text_files(root, (".sh", ".bash", ".slurm")):
        for command in text.replace("\\\n", " ").splitlines():
            if _SINGLE.search(command):
                continue
            try:
                words = shlex.split(command, comments=True)
            except ValueError:
                words = command.split()
            launched = False
            for i, word in enumerate(words):
                base = word.rsplit("/", 1)[-1]
                if base in _LAUNCHERS or (base == "launch" and words[i - 1 : i] == ["accelerate"]):
                    launched = True
                elif launched and base.endswith(".py"):
                    names.add(base)
                    break
                elif launched and word in _MODULE_FLAGS:
                    module = words[i + 1] if i + 1 < len(words) else ""
                    if _MODULE.match(module):
                        names.add(_module_file(module))
                    break
    return frozenset(names)


def _module_file(module: str) -> str:
    """The file name a launched module runs: ``scripts.train`` -> ``train.py`` (a stray
    ``.py`` suffix, ``-m scripts.train.py``, read as the intent it shows)."""
    return module.removesuffix(".py").rsplit(".", 1)[-1] + ".py"


@functools.lru_cache(maxsize=64)
def one_process_per_node(root: str) -> bool:
    """Every launcher command of the repository's shell scripts (``torchrun``, ``deepspeed``,
    ``accelerate launch``, ``python -m torch.distributed.launch``) asks for one process per
    machine (``--nproc_per_node=1``, ``deepspeed --num_gpus 1 --num_nodes 2``), and there is at
    least one: the repository's layout is one GPU per node, so each process's ``cuda:0`` is its
    own machine's GPU (``deepspeed --num_gpus 1`` even hides the others)."""
    commands = 0
    for _, text in text_files(root, (".sh", ".bash", ".slurm")):
        for command in text.replace("\\\n", " ").splitlines():
            words = command.split("#", 1)[0].split()
            bases = [w.rsplit("/", 1)[-1] for w in words]
            launched = any(b in _LAUNCHERS for b in bases) or any(
                a == "accelerate" and b == "launch" for a, b in itertools.pairwise(bases)
            )
            if not launched:  # a script given by a variable (`${1:-train.py}`) counts too
                continue
            if not _SINGLE.search(command):
                return False
            commands += 1
    return commands > 0
