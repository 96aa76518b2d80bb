"""Reading DeepSpeed's checkpoint files without trusting their pickles.

DeepSpeed loads its files with ``torch.load(weights_only=False)``. Everything that hands
them to its readers is here, in one place to audit (as :mod:`~gpu_training.checkpoint.dcp_read`
is for DCP): the check that every ``.pt`` file holds only the allow-listed classes
(:func:`check_files`, so that a refusal names the file), DeepSpeed's own loads forced to
``weights_only`` (:func:`guarded`), a refusal inside them turned into one
:class:`CheckpointError` (:func:`refusals`), and :func:`deepspeed_model_state`, the offline
read of the full weights. Both the every-rank load
(:func:`~gpu_training.checkpoint.zero.load_deepspeed`) and the offline one (the DeepSpeed
format's ``full_state``, :mod:`~gpu_training.checkpoint.formats`) go through it. DeepSpeed
itself is imported only when a checkpoint is read.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from gpu_training.checkpoint.files import EXTRA_NAME, MANIFEST_NAME, CheckpointError
from gpu_training.checkpoint.safe_load import (
    DEEPSPEED_SAFE_GLOBALS,
    check_pickles,
    refused_message,
    resolve_globals,
    weights_only_loads,
)

__all__ = [
    "check_files",
    "deepspeed_model_state",
    "guarded",
    "load_deepspeed_file",
    "mapped_loads",
    "quiet",
    "refusals",
]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """DeepSpeed logs a line per file on every rank; only errors should reach the user."""
    import logging

    logger = logging.getLogger("DeepSpeed")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def guarded(trusted: bool) -> Iterator[None]:
    """DeepSpeed's own ``torch.load`` calls, forced to ``weights_only`` unless trusted."""
    if trusted:
        yield
        return
    with weights_only_loads(DEEPSPEED_SAFE_GLOBALS):
        yield


@contextlib.contextmanager
def mapped_loads(engine: Any, trusted: bool) -> Iterator[None]:
    """DeepSpeed's own file loads memory-mapped, its optimizer state copied into its tensors.

    ``engine.load_checkpoint`` ``torch.load``s the model-states file twice on every rank (once
    to check it) and each optimizer file into fresh memory. Mapped, each load shares the page
    cache's pages (which the checksum pass just read) and only what DeepSpeed copies into the
    engine is copied. torch's ``Optimizer.load_state_dict`` keeps the loaded moments as they
    are: they are copied here into the tensors the optimizer held before (a clone where it
    held none), so no state stays backed by the checkpoint's files. ``trusted`` leaves
    DeepSpeed's reader as it is.

    Args:
        engine: The ``DeepSpeedEngine`` about to ``load_checkpoint``.
        trusted: Whether DeepSpeed's own, unforced reader runs (nothing is changed then).

    Yields:
        Nothing; DeepSpeed's loads inside are ``weights_only`` (run it inside :func:`guarded`).
    """
    reader: Any = getattr(engine, "checkpoint_engine", None)
    base: Any = getattr(getattr(engine, "optimizer", None), "optimizer", None)
    state = getattr(base, "state", None)
    if trusted or type(reader).__name__ != "TorchCheckpointEngine" or state is None:
        yield
        return
    held = {param: dict(values) for param, values in state.items()}

    def load(path: str, map_location: Any = None) -> Any:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=True)

    reader.load = load  # this engine's loads only, for this call
    try:
        yield
    finally:
        del reader.load  # the class's own method again
    for param, values in base.state.items():  # load_state_dict replaced the dict itself
        for key, value in values.items():
            if not isinstance(value, torch.Tensor):
                continue
            old = held.get(param, {}).get(key)
            if old is value:
                continue
            if isinstance(old, torch.Tensor) and _alike(old, value):
                values[key] = old.copy_(value)
            else:
                values[key] = value.clone()  # off the mapping: the file may go away


def _alike(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device)


def _pickle_files(step_dir: Path, share: slice = slice(None)) -> list[Path]:
    """DeepSpeed's ``.pt`` files the manifest lists (this rank's share), not ``extra.pt``."""
    manifest = json.loads((step_dir / MANIFEST_NAME).read_text())
    names = sorted(
        str(e["name"])
        for e in manifest["files"]
        if str(e["name"]).endswith(".pt") and e["name"] != EXTRA_NAME
    )
    return [step_dir / name for name in names[share]]


def check_files(step_dir: Path, share: slice = slice(None)) -> None:
    """DeepSpeed's files hold only the allow-listed classes; ``extra.pt`` only plain data.

    ``extra.pt`` is ours, read with ``weights_only`` whatever the trust: its refusal does not
    suggest ``--trust-checkpoint``, which could not help.

    Args:
        step_dir: A committed DeepSpeed step directory.
        share: Which of its files (sorted by name) this rank checks; all by default.

    Raises:
        CheckpointError: Naming the first file that holds anything else.
    """
    check_pickles(_pickle_files(step_dir, share), DEEPSPEED_SAFE_GLOBALS)
    if share.start in (None, 0) and (step_dir / EXTRA_NAME).exists():
        check_pickles([step_dir / EXTRA_NAME], hint=None)


def load_deepspeed_file(file: Path, *, trusted: bool = False) -> dict[str, Any]:
    """One of DeepSpeed's ``.pt`` files, memory-mapped: ``weights_only`` and the allow-list.

    Tensors are mapped, not read: a slice of one reads only its pages. ``trusted``
    (``--trust-checkpoint``) hands the file to DeepSpeed's own reader, which unpickles it
    without the allow-list (and reads it whole): nothing in this package does.

    Args:
        file: A model-states or optimizer-states file of a committed DeepSpeed checkpoint.
        trusted: Let the pickle build any object.

    Returns:
        The dict it holds.

    Raises:
        CheckpointError: Naming the file: it holds objects outside the allow-list (nothing
            runs), cannot be read, does not hold a dict, or DeepSpeed is not installed.
    """
    if not torch.cuda.is_available():  # else DeepSpeed probes for accelerators and warns
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed  # noqa: F401  (its classes are on the allow-list)
    except ImportError as exc:
        raise CheckpointError(
            f"{file.parent} is a DeepSpeed checkpoint: reading it needs the deepspeed extra "
            "(pip install 'gpu-training[deepspeed]')"
        ) from exc
    try:
        if trusted:  # DeepSpeed's own reader, unforced: what --trust-checkpoint lets run
            from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import (
                TorchCheckpointEngine,
            )

            with quiet():
                value = TorchCheckpointEngine().load(str(file), map_location="cpu")
        else:
            with torch.serialization.safe_globals(resolve_globals(DEEPSPEED_SAFE_GLOBALS)):
                value = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        message = refused_message(file, exc)
        if message is None:
            message = f"could not read {file}: {type(exc).__name__}: {' '.join(str(exc).split())}"
        raise CheckpointError(message[:1000]) from exc
    if not isinstance(value, dict):
        raise CheckpointError(f"{file} holds a {type(value).__name__}, expected a dict")
    return value


@contextlib.contextmanager
def refusals(step_dir: Path) -> Iterator[None]:
    """A ``weights_only`` refusal inside DeepSpeed becomes one CheckpointError naming the step."""
    try:
        yield
    except Exception as exc:
        message = refused_message(step_dir, exc)
        if message is None:
            raise
        raise CheckpointError(message) from exc


def deepspeed_model_state(step_dir: Path, *, trusted: bool = False) -> dict[str, torch.Tensor]:
    """The full fp32 weights of a DeepSpeed ZeRO checkpoint, gathered from every rank's shards.

    Offline, in one process (DeepSpeed's ``zero_to_fp32``), its loads forced to
    ``weights_only`` with the allow-list unless ``trusted``.

    Args:
        step_dir: A committed ``step-XXXXXXXX`` directory of format ``"deepspeed"``.
        trusted: Let DeepSpeed unpickle without the allow-list (``--trust-checkpoint``).

    Returns:
        ``{name: tensor}`` as the unwrapped model's ``state_dict`` names them.

    Raises:
        CheckpointError: If the deepspeed extra is missing, a file holds objects outside the
            allow-list (nothing runs), or the files cannot be read.
    """
    if not trusted:
        check_files(step_dir)
    try:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except ImportError as exc:
        raise CheckpointError(
            f"{step_dir} is a DeepSpeed checkpoint: reading it needs the deepspeed extra "
            "(pip install 'gpu-training[deepspeed]')"
        ) from exc
    try:
        with quiet(), guarded(trusted), refusals(step_dir):
            state = get_fp32_state_dict_from_zero_checkpoint(
                str(step_dir.parent), tag=step_dir.name
            )
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"could not read {step_dir}: {type(exc).__name__}: {exc}") from exc
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
