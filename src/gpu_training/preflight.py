"""What ``gpu-training train`` checks on the launching host, before any process starts.

A job that cannot run should say so in one line, at once — not after torchrun has started
every rank, not after an hour of training at the first save. :func:`check_launch` runs the
checks that need no process group:

- the task, its options and the strategy's options (:func:`~gpu_training.strategy.check_job`),
  and for the built-in task the data: the training set holds a global batch;
- the global batch splits over the requested number of ranks;
- the checkpoint and output directories can be written (a probe file is created and removed;
  a path under a file or a read-only directory is named);
- the checkpoint the run would resume from: no damaged checkpoint stands in the way, the
  strategy can load its format (every format loads every other's), its recorded settings
  match the job (or ``allow_config_change``), its model has the job's parameter shapes, its
  files hold nothing outside the ``weights_only`` allow-lists, a sharded one's index reads
  only the checkpoint's own files, and its data position can be restored on this many ranks
  (a stream's own per-rank states only on the world size that saved them; a stream nothing
  placed, never).

Every failure is a :class:`~gpu_training.config.ConfigError` naming the field or file. A
resume laid out anew is said in one line, before any process starts
(``resuming step 10 written by DDP on 2 ranks under FSDP on 4: optimizer state resharded``).

Example:
    >>> import tempfile
    >>> from gpu_training.job import JobConfig
    >>> job = JobConfig.from_dict({
    ...     "task_options": {"n_layer": 1, "n_embd": 32, "n_head": 2, "block_size": 32},
    ...     "training": {"global_batch_size": 8, "per_device_batch_size": 4},
    ...     "run": {"output_dir": tempfile.mkdtemp()}})
    >>> check_launch(job, nproc=2)  # nothing to resume, nothing to warn about
    []
    >>> check_launch(job, nproc=3)
    Traceback (most recent call last):
    ...
    gpu_training.config.ConfigError: --nproc 3: global batch 8 does not split into 3 ranks ...
"""

from __future__ import annotations

import errno
import json
import secrets
from collections.abc import Mapping
from pathlib import Path

import torch

from gpu_training.checkpoint import (
    MANIFEST_NAME,
    CheckpointError,
    find_resumable,
    format_of,
    strip_wrapper_prefixes,
)
from gpu_training.config import ConfigError, TrainingConfig
from gpu_training.job import JobConfig
from gpu_training.resume import ResumeError, check_resumable, layout_change
from gpu_training.stateful_stream import check_saved_world_size
from gpu_training.strategy.job_check import check_job
from gpu_training.strategy.tensor_parallel import check_degree
from gpu_training.streaming import NoPosition
from gpu_training.tasks import BUILTIN_TASKS, Task
from gpu_training.train_data import check_train_data

__all__ = ["check_launch", "check_writable"]


def check_launch(
    job: JobConfig,
    nproc: int,
    *,
    allow_config_change: bool = False,
    trust_checkpoint: bool = False,
) -> list[str]:
    """Every check of a ``train`` launch that needs no process; returns warnings to print.

    Prints one line when the run would resume under another strategy or world size than
    its checkpoint was written with (:func:`~gpu_training.resume.layout_change`).

    Args:
        job: The job to launch.
        nproc: The world size it will run with.
        allow_config_change: Resume even though math-relevant settings changed.
        trust_checkpoint: Skip the allow-list check of DeepSpeed files (their reader will
            unpickle them as it likes).

    Returns:
        Warnings (settings changed that do not change the math), one line each.

    Raises:
        ConfigError: The first problem, naming the field, flag or file.
    """
    check_degree(nproc, job.strategy.tensor_parallel)  # TP's ranks read one replica's data
    task = check_job(job)  # after: a degree that splits no world of this size says so first
    try:
        cfg = job.training.for_world_size(nproc // job.strategy.tensor_parallel)
    except ConfigError as err:
        raise ConfigError(f"--nproc {nproc}: {err}", "training.global_batch_size") from None
    if job.task.name in BUILTIN_TASKS:  # cheap for the built-in data; a user's may not be
        _check_data(task, cfg)
    # the output directory first: an unset checkpoint.dir lies under it, and the user set it
    check_writable(Path(job.run.output_dir), "run.output_dir")
    check_writable(job.checkpoint_dir, "checkpoint.dir")
    return _check_resume(job, nproc, task, allow_config_change, trust_checkpoint)


def check_writable(path: Path, field: str) -> None:
    """``path`` is (or can be created as) a directory this process can write into.

    A probe file is created in ``path`` (or, when it does not exist yet, a probe directory in
    its nearest existing ancestor) and removed at once: nothing is left behind.

    Args:
        path: The directory the run will write into.
        field: The job field that names it, for the message.

    Raises:
        ConfigError: If ``path`` or an ancestor is a file, or it cannot be written.
    """
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        where = "is a file" if existing == path else f"is under a file ({existing})"
        raise ConfigError(f"field '{field}': {path} {where}; expected a directory", field)
    probe = existing / f".gpu-training-probe-{secrets.token_hex(4)}"
    try:
        if existing == path:
            probe.touch(exist_ok=False)
            probe.unlink()
        else:
            probe.mkdir()
            probe.rmdir()
    except OSError as exc:
        reason = "read-only" if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else ""
        raise ConfigError(
            f"field '{field}': cannot write in {existing}"
            + (f" ({reason}: {exc.strerror})" if reason else f" ({exc.strerror})")
            + "; choose a directory this user can write",
            field,
        ) from None


def _check_data(task: Task, cfg: TrainingConfig) -> None:
    train, _ = task.build_data()
    check_train_data(train, cfg)  # a stream reads nothing here: it needs max_steps


def _check_resume(
    job: JobConfig, nproc: int, task: Task, allow_config_change: bool, trust_checkpoint: bool
) -> list[str]:
    if not job.checkpoint.resume:
        return []
    found = find_resumable(job.checkpoint_dir, verify_checksums=True)
    refusal = found.refusal(job.checkpoint_dir)
    if refusal is not None:
        raise ResumeError(refusal)
    if found.latest is None:
        return []
    step_dir = found.latest
    manifest = json.loads((step_dir / MANIFEST_NAME).read_text())
    warnings = check_resumable(job, step_dir, manifest, allow_config_change=allow_config_change)
    fmt = format_of(manifest)
    try:
        # every pickle a resume would read holds plain data only (nothing is executed here)
        fmt.check_contents(step_dir, manifest, trusted=trust_checkpoint)
        saved = fmt.saved_shapes(step_dir, manifest)
        position = fmt.read_run_state(step_dir).get("sampler_state")
    except CheckpointError as err:
        raise ResumeError(f"cannot resume from {step_dir}: {err}") from None
    _check_data_position(position, nproc // job.strategy.tensor_parallel)
    if saved is not None:
        with torch.device("meta"):  # the shapes only: no memory, no initialisation
            model = task.build_model()
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        frozen = {k for k, p in model.named_parameters() if not p.requires_grad}
        _compare_shapes(step_dir, saved, shapes, frozen)
    change = layout_change(job, manifest, nproc)
    if change is not None:
        print(f"resuming step {manifest.get('step')} {change}", flush=True)
    return warnings


def _check_data_position(position: object, world_size: int) -> None:
    """What the ranks would refuse of the checkpoint's data position, said before they start."""
    check_saved_world_size(position, world_size)  # a stream's own per-rank states
    if isinstance(position, Mapping) and position.get("stream") == 0:  # a stream nothing placed
        NoPosition(str(position.get("name") or "the training stream")).load_state_dict(position)


def _compare_shapes(
    step_dir: Path,
    saved: dict[str, tuple[int, ...]],
    wanted: dict[str, tuple[int, ...]],
    frozen: set[str],
) -> None:
    wanted = dict(strip_wrapper_prefixes(wanted))
    frozen = set(strip_wrapper_prefixes(dict.fromkeys(frozen)))
    differ = [k for k in wanted if k in saved and saved[k] != wanted[k]]
    # DeepSpeed leaves frozen parameters out of its files: the ranks check those as they load
    missing = [k for k in wanted if k not in saved and k not in frozen]
    unexpected = [k for k in saved if k not in wanted]
    if not (differ or missing or unexpected):
        return
    parts = []
    if differ:
        k = differ[0]
        parts.append(
            f"'{k}' is {list(saved[k])} there and {list(wanted[k])} in this job"
            + (f" (and {len(differ) - 1} more)" if len(differ) > 1 else "")
        )
    if missing:
        parts.append(f"{len(missing)} of the job's tensors are not in it (e.g. '{missing[0]}')")
    if unexpected:
        parts.append(
            f"it holds {len(unexpected)} tensors the job's model lacks (e.g. '{unexpected[0]}')"
        )
    raise ResumeError(
        f"{step_dir} was written by a model of another shape: "
        + "; ".join(parts)
        + "; use the task options it was written with, or another checkpoint.dir for a new run"
    )
