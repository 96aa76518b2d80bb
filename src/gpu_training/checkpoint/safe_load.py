"""The trust boundary around third-party checkpoint readers: they unpickle only plain data.

Our own readers call ``torch.load(weights_only=True)`` (:func:`load_plain`). DeepSpeed's
(``engine.load_checkpoint``, ``zero_to_fp32``) and DCP's call ``torch.load(weights_only=False)``
on files whose names the checkpoint's author chooses, and an AST ban on our own calls cannot
see theirs. While :func:`weights_only_loads` is active every ``torch.load`` in the process is
forced to ``weights_only=True`` (torch's own ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` switch, which
overrides an explicit ``weights_only=False``), with a short allow-list of the plain-data
classes DeepSpeed's optimizer files hold (:data:`DEEPSPEED_SAFE_GLOBALS`). A file holding
anything else is refused, and nothing in it runs. What reads DCP's and DeepSpeed's files
through it: :mod:`~gpu_training.checkpoint.dcp_read`, :mod:`~gpu_training.checkpoint.zero_read`.

A checkpoint that needs more than that can still be read by whoever trusts its source:
``trusted=True`` in the Python API, ``--trust-checkpoint`` on the command line.

Example:
    >>> import io, os, torch
    >>> buffer = io.BytesIO()
    >>> torch.save({"w": torch.ones(1)}, buffer)
    >>> with weights_only_loads():
    ...     _ = buffer.seek(0)
    ...     torch.load(buffer, weights_only=False)["w"].tolist()  # forced to weights_only=True
    [1.0]
    >>> "TORCH_FORCE_WEIGHTS_ONLY_LOAD" in os.environ  # restored afterwards
    False
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "DEEPSPEED_SAFE_GLOBALS",
    "TRUST_HINT",
    "check_loads_back",
    "check_pickles",
    "load_plain",
    "refused_message",
    "resolve_globals",
    "weights_only_loads",
]

DEEPSPEED_SAFE_GLOBALS: tuple[str, ...] = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
)
"""Classes DeepSpeed 0.19's ZeRO 1/2/3 files pickle (loss scalers, an enum, a dataclass of
two ints): plain data, allowed under ``weights_only``. Found by loading every file of ZeRO
1/2/3, offload, bf16 and fp16 checkpoints with ``weights_only=True``."""

TRUST_HINT = (
    "if you trust whoever wrote this checkpoint, pass --trust-checkpoint (trusted=True in "
    "Python) to let its reader unpickle it"
)
"""How a refusal tells the user what to do, in every message that refuses a file."""

_FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
_FORCE_NO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"  # both set: torch raises; ours wins here
_lock = threading.Lock()
_depth = 0
_saved: dict[str, str | None] = {}


def resolve_globals(names: Iterable[str]) -> list[Any]:
    """The classes named (``"pkg.mod.Class"``) that import here; the others are skipped.

    DeepSpeed's are imported quietly: without a GPU it would log its accelerator guess on
    stdout (before the resume line ``train`` prints), so the CPU is named for it first, as
    the DeepSpeed strategy does.
    """
    names = list(names)
    if any(n.startswith("deepspeed.") for n in names) and "deepspeed" not in sys.modules:
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
    found = []
    for name in names:
        module, _, attr = name.rpartition(".")
        try:
            found.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):  # another DeepSpeed version: not allowed, fine
            continue
    return found


@contextlib.contextmanager
def weights_only_loads(allow: Iterable[str] = ()) -> Iterator[None]:
    """Forces every ``torch.load`` in this process to ``weights_only=True`` while active.

    Re-entrant and thread-safe (the switch is process-wide: an environment variable that
    ``torch.load`` reads on each call); the previous environment comes back on exit.

    Args:
        allow: Dotted names of extra classes to allow (e.g. :data:`DEEPSPEED_SAFE_GLOBALS`);
            names that do not import are skipped.

    Yields:
        Nothing; use it as ``with weights_only_loads(): ...``.
    """
    import torch

    global _depth
    with _lock:
        if _depth == 0:
            _saved.clear()
            _saved.update({key: os.environ.get(key) for key in (_FORCE, _FORCE_NO)})
            os.environ[_FORCE] = "1"
            os.environ.pop(_FORCE_NO, None)
        _depth += 1
    try:
        with torch.serialization.safe_globals(resolve_globals(allow)):
            yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for key, value in _saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value


def refused_message(
    file: Path | str, exc: BaseException, *, hint: str | None = TRUST_HINT
) -> str | None:
    """The one-line refusal for ``exc`` if it is a ``weights_only`` refusal, else None.

    Args:
        file: The file (or directory) that was being read.
        exc: What the reader raised (possibly wrapping the unpickling error).
        hint: What the user can do, last (None where ``--trust-checkpoint`` would not help:
            plain and sharded files are read with ``weights_only`` whatever the trust).

    Returns:
        ``"refused to read FILE: ..."`` naming the global torch refused, then ``hint``;
        None when ``exc`` is some other error.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if isinstance(current, pickle.UnpicklingError) or "Weights only load failed" in text:
            return (
                f"refused to read {file}: it holds objects outside the weights_only allow-list, "
                f"and unpickling them could run code (nothing from it was executed; "
                f"{_culprit(text)})" + (f"; {hint}" if hint else "")
            )
        current = current.__cause__ or current.__context__
    return None


def check_pickles(
    files: Iterable[Path], allow: Iterable[str] = (), *, hint: str | None = TRUST_HINT
) -> None:
    """Refuses the first file that ``torch.load(weights_only=True)`` would not read.

    Run before a third-party reader gets the files, so the refusal names the file (the
    forced loads of :func:`weights_only_loads` refuse too, but without a file name). Memory
    maps the tensors: the cost is about one read of the pickles, not of the weights.

    Args:
        files: ``torch.save`` files (``.pt``).
        allow: Extra classes allowed, as for :func:`weights_only_loads`.
        hint: What a refusal tells the user to do (see :func:`refused_message`).

    Raises:
        CheckpointError: Naming the file and the refused global, with :data:`TRUST_HINT`;
            or the file cannot be read at all.
    """
    import torch

    from gpu_training.checkpoint.files import CheckpointError

    allowed = resolve_globals(allow)
    for file in files:
        try:
            with torch.serialization.safe_globals(allowed):
                torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:
            message = refused_message(file, exc, hint=hint)
            if message is None:
                message = f"could not read {file}: {type(exc).__name__}: {_short(exc)}"
            raise CheckpointError(message) from exc


def load_plain(file: Path, *, mmap: bool = False) -> dict[str, Any]:
    """``torch.load(file, weights_only=True)``, which must hold a dict.

    Args:
        file: A ``state.pt`` or ``extra.pt``.
        mmap: Map the tensors' storage instead of reading it: a tensor's pages are read
            when it is used (and are the page cache's, not the process's, to keep).

    Returns:
        The dict it holds, tensors on the CPU.

    Raises:
        CheckpointError: If the file cannot be read, holds objects outside torch's
            ``weights_only`` allowlist (nothing is executed), or does not hold a dict.
    """
    import torch

    from gpu_training.checkpoint.files import CheckpointError

    try:
        value = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:
        # torch's own text suggests weights_only=False: the one advice not to give here
        message = refused_message(file, exc, hint=None)  # weights_only, whatever the trust
        if message is None:
            message = f"could not load {file}: {type(exc).__name__}: {' '.join(str(exc).split())}"
        raise CheckpointError(message) from exc
    if not isinstance(value, dict):
        raise CheckpointError(f"{file} holds a {type(value).__name__}, expected a dict")
    return value


def check_loads_back(load: Callable[[], object], subject: str) -> None:
    """Refuses to write state that ``torch.load(weights_only=True)`` could never read back.

    Every writer runs this before committing, so a state that could not be resumed is
    refused at save time, not on the day it is needed.

    Args:
        load: Reads the state back with ``weights_only=True`` (from the written file, or from
            a buffer for values not written yet).
        subject: What holds the state, to start the message (``"extra"``,
            ``"not saving DIR: the state"``).

    Raises:
        CheckpointError: ``"<subject> holds objects that torch.load(weights_only=True)
            refuses ..."``, with what to save instead and torch's reason.
    """
    from gpu_training.checkpoint.files import CheckpointError

    try:
        load()
    except pickle.UnpicklingError as exc:
        reason = " ".join(str(exc).split())[:600]
        raise CheckpointError(
            f"{subject} holds objects that torch.load(weights_only=True) refuses, so it could "
            f"never be loaded. Save tensors, numbers, strings and lists/dicts of them (convert "
            f"numpy arrays with torch.from_numpy), or allow a type with "
            f"torch.serialization.add_safe_globals. torch says: {reason}"
        ) from exc


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def _culprit(text: str) -> str:
    """The ``GLOBAL x.y`` torch names, or its message's last line, shortened."""
    import re

    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return f"it asks for {found.group(1)}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "torch says: " + (lines[-1][:300] if lines else "refused")
