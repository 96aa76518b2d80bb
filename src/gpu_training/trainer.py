"""The main job: ``Trainer(job).fit()`` composes the helpers into one correct training run.

context → task (model, data) → world-size-invariant sampler → strategy wrapping →
MixedPrecisionTrainer → warmup-cosine schedule → CheckpointManager (auto-resume) → step loop
→ metrics reduced over ranks → rank-0 reporting. The Trainer holds no math of its own: every
piece is a helper a hand-written loop can use directly (``examples/train_ddp.py`` does).

Example:
    >>> from gpu_training.job import JobConfig
    >>> import tempfile
    >>> job = JobConfig.from_dict({
    ...     "task": "charlm", "task_options": {"n_layer": 1, "n_embd": 32, "n_head": 2,
    ...                                        "block_size": 32},
    ...     "training": {"global_batch_size": 8, "per_device_batch_size": 4, "max_steps": 3,
    ...                  "learning_rate": 3e-3},
    ...     "strategy": {"name": "none"},
    ...     "run": {"output_dir": tempfile.mkdtemp(), "progress": False, "log_every": 1,
    ...             "eval_every": 3, "eval_batches": 2, "plot": False, "tensorboard": False}})
    >>> summary = Trainer(job, quiet=True).fit()
    >>> int(summary["step"]), summary["val_loss"] < summary["first_loss"] + 1
    (3, True)
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gpu_training.amp import MixedPrecisionTrainer, resolve_precision
from gpu_training.checkpoint import CheckpointError, CheckpointManager
from gpu_training.config import ConfigError, TrainingConfig
from gpu_training.data import GlobalBatchSampler
from gpu_training.ddp import (
    DistributedContext,
    cleanup_distributed,
    init_distributed,
    move_to_device,
    process_group_up,
    reduce_scalar_dict,
    resolve_device,
    unwrap_model,
)
from gpu_training.job import JobConfig
from gpu_training.preemption import PreemptionHandler
from gpu_training.reporting import MetricsWriter, plot_metrics
from gpu_training.resume import (
    ResumeError,
    capture_run_state,
    capture_training_state,
    check_resumable,
    restore_run_state,
    restore_training_state,
)
from gpu_training.rng import seed_everything
from gpu_training.schedule import linear_warmup_cosine_lr
from gpu_training.step import step_batches, sum_and_count, train_step
from gpu_training.strategy.prepared import Prepared, prepare
from gpu_training.tasks import Task, build_task, count_scored
from gpu_training.throughput import ThroughputMeter
from gpu_training.trackers import tracker_params
from gpu_training.watchdog import StallWatchdog

__all__ = ["Callback", "Trainer", "TrainerState", "build_task", "check_job"]


@dataclass
class TrainerState:
    """What callbacks can read while the run goes on."""

    step: int = 0
    """Optimizer steps completed."""
    total_steps: int = 0
    last_metrics: dict[str, float] = field(default_factory=dict)
    val_metrics: dict[str, float] = field(default_factory=dict)
    preempted: bool = False


class Callback(Protocol):
    """Hooks called on every rank (guard output with ``trainer.ctx.is_main_process``).

    Implement only the hooks you need; missing ones are skipped.
    """

    def on_train_start(self, trainer: Trainer) -> None: ...

    def on_log(self, trainer: Trainer, metrics: dict[str, float]) -> None: ...

    def on_eval(self, trainer: Trainer, metrics: dict[str, float]) -> None: ...

    def on_checkpoint(self, trainer: Trainer, path: Path | None) -> None: ...

    def on_train_end(self, trainer: Trainer, summary: dict[str, float]) -> None: ...


def check_job(job: JobConfig, task: Task | None = None) -> Task:
    """Resolve the job's task and check its strategy options against the model's structure.

    Cheap: the model is built on the ``meta`` device (no memory, no weights). Run it before
    starting processes or writing files, so bad input fails first.

    Raises:
        ConfigError: (``TaskError``, ``StrategyError``) naming the offending field or name.
    """
    from gpu_training.strategy import find_blocks

    if job.strategy.name == "deepspeed":
        _check_deepspeed_job(job)
    task = task if task is not None else build_task(job)
    if job.strategy.block_classes:
        with torch.device("meta"):  # only the module structure is needed
            model = task.build_model()
        find_blocks(model, job.strategy.block_classes)
    return task


def _check_deepspeed_job(job: JobConfig) -> None:
    """The DeepSpeed config leaves the LR to the Trainer, and the deepspeed extra is installed.

    The file is checked first: its mistakes are the user's to fix whether or not the extra
    is installed on this machine.
    """
    import importlib.util

    from gpu_training.config import read_config_file
    from gpu_training.strategy import StrategyError

    path = job.strategy.deepspeed_config
    if path is not None:
        raw = read_config_file(path)  # a ConfigError names the file when it cannot be read
        if "scheduler" in raw:
            # Two schedulers would both set the LR; the Trainer's is the one checkpoints restore.
            raise StrategyError(
                f"field 'strategy.deepspeed_config': {path} has a 'scheduler' section; the "
                "Trainer drives the learning rate itself (training.warmup_steps, "
                "training.min_lr_ratio): remove it",
                "strategy.deepspeed_config",
            )
    if importlib.util.find_spec("deepspeed") is None:
        raise StrategyError(
            "field 'strategy.name': 'deepspeed' needs the deepspeed extra "
            "(pip install 'gpu-training[deepspeed]')",
            "strategy.name",
        )


def _mean_finite(norms: list[torch.Tensor]) -> float:
    """Mean of the finite gradient norms of a log window (one host sync for all of them)."""
    if not norms:
        return 0.0
    values = torch.stack(norms).double().cpu()  # one step function: one device for all
    finite = values[torch.isfinite(values)]
    return float(finite.mean()) if finite.numel() else 0.0  # every step overflowed (fp16)


@dataclass
class _Run:
    """The objects a step loop, a checkpoint and a resume share."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    amp: MixedPrecisionTrainer | None
    """None under DeepSpeed (the engine owns precision and clipping)."""
    sampler: GlobalBatchSampler
    generators: dict[str, torch.Generator]
    kind: str
    """Checkpoint format: ``torch`` (full state from rank 0), ``dcp`` (FSDP) or ``deepspeed``."""
    engine: Any = None


class Trainer:
    """Runs a :class:`~gpu_training.job.JobConfig` on however many ranks it is launched with.

    Args:
        job: The job (task, training, strategy, checkpoint, run sections).
        task: Use this task instead of the one the job names (the Python API).
        callbacks: Objects with any of the :class:`Callback` hooks.
        quiet: Print nothing (metrics are still written).
        allow_config_change: Resume from a checkpoint written with other math-relevant
            settings (they are named in a warning); without it such a resume is refused.
        trust_checkpoint: Let DeepSpeed's readers unpickle the checkpoint without the
            ``weights_only`` allow-list (only for checkpoints from a source you trust).
    """

    def __init__(
        self,
        job: JobConfig,
        *,
        task: Task | None = None,
        callbacks: Sequence[Any] = (),
        quiet: bool = False,
        allow_config_change: bool = False,
        trust_checkpoint: bool = False,
    ) -> None:
        self.job = job
        self.allow_config_change = allow_config_change
        self.trust_checkpoint = trust_checkpoint
        self._tracker_runs: dict[str, str] = {}  # tracker -> run id, kept in checkpoints
        self._val_rounds = 0  # validation forwards per rank (_val_loader)
        self._extra: dict[str, Any] | None = None  # the task's part of every checkpoint
        self.task = task
        self.callbacks = list(callbacks)
        self.quiet = quiet
        self.state = TrainerState()
        self.ctx = DistributedContext()
        self.config: TrainingConfig = job.training

    # --- helpers ------------------------------------------------------------------------

    def _emit(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            method = getattr(callback, hook, None)
            if callable(method):
                method(self, *args)

    def print(self, message: str) -> None:
        """Print on rank 0 only (and not when ``quiet``)."""
        if self.ctx.is_main_process and not self.quiet:
            print(message, flush=True)

    def _prepare(
        self, model: nn.Module, device: torch.device, cfg: TrainingConfig, total: int
    ) -> Prepared:
        def make_optimizer(params: Any) -> torch.optim.Optimizer:
            return torch.optim.AdamW(
                [p for p in params if p.requires_grad],  # frozen (LoRA base): no state
                lr=cfg.scaled_learning_rate,
                weight_decay=cfg.weight_decay,
                fused=device.type == "cuda",
            )

        return prepare(
            model,
            self.job.strategy,
            self.ctx,
            cfg,
            device=device,
            optimizer=make_optimizer,
            total_steps=total,
        )

    def _speed_up(self, model: nn.Module, device: torch.device, precision: str) -> None:
        """TF32 and ``torch.compile`` as the run section asks (before wrapping)."""
        run = self.job.run
        if device.type == "cuda":
            tf32 = run.tf32 if run.tf32 is not None else precision in ("bf16", "fp16")
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
        if not run.compile:
            return
        if self.job.strategy.name == "fsdp":
            from gpu_training.strategy import detect_blocks, find_blocks

            spec = self.job.strategy.block_classes
            blocks = find_blocks(model, spec) if spec else detect_blocks(model)
            for _, block in blocks:  # one graph per FSDP unit, compiled in place
                block.compile()
        else:
            model.compile()  # in place: state_dict keys keep no "_orig_mod." prefix

    def _evaluate(
        self,
        model: nn.Module,
        loader: DataLoader[Any],
        device: torch.device,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> dict[str, float]:
        """Validation loss over the same samples on any world size: a sum and a count.

        Each rank scores its share (:meth:`_val_loader`); the sums and counts are added over
        the ranks, so the result is the loss over every evaluated sample (or scored target)
        whatever the number of ranks, to float rounding.
        """
        assert self.task is not None
        loss_fn = self.task.loss_sum or self.task.loss_fn
        model.eval()
        total = torch.zeros((), dtype=torch.float64, device=device)
        count = torch.zeros((), dtype=torch.float64, device=device)
        done = 0
        with torch.no_grad():
            for batch in loader:
                inputs, targets = move_to_device(batch, device)
                with autocast():
                    part, n = sum_and_count(loss_fn(model(inputs), targets), targets)
                total += part.double()
                count += n.to(device=device, dtype=torch.float64)
                done += 1
            # A sharded forward is a collective (FSDP's all-gathers, DDP's buffer broadcast):
            # a rank whose share is one batch short runs one unscored forward, or they hang.
            for _ in range(self._val_rounds - done):
                dummy = loader.collate_fn([loader.dataset[0]])
                with autocast():
                    model(move_to_device(dummy, device)[0])
        model.train()
        sums = reduce_scalar_dict({"loss_sum": total, "count": count}, self.ctx, average=False)
        loss = sums["loss_sum"] / max(1.0, sums["count"])
        return {"loss": loss, "ppl": math.exp(min(loss, 50.0))}

    # --- the run --------------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        """Train to the configured number of steps (resuming when a checkpoint exists).

        Returns:
            A summary: ``step``, ``first_loss`` and ``train_loss`` (logged, reduced over ranks),
            ``val_loss`` (last evaluation, NaN without validation data), ``baseline`` (the
            task's reference loss, NaN if none), ``seconds`` and ``preempted`` (1.0 if a
            signal stopped the run).
        """
        owns_group = not process_group_up()
        self.ctx = init_distributed()
        try:
            return self._fit()
        except BaseException as exc:
            if self.ctx.is_distributed:
                # The run's objects live on in the traceback, DDP's reducer holding the group:
                # freed, the teardown below closes it and the peers stop at once (DESIGN.md).
                traceback.clear_frames(exc.__traceback__)
            raise
        finally:
            if owns_group:
                cleanup_distributed()  # no barrier with an exception in flight

    def _fit(self) -> dict[str, float]:
        job, ctx = self.job, self.ctx
        device = resolve_device(ctx)
        cfg = job.training.for_world_size(ctx.world_size)
        self.config = cfg
        precision = resolve_precision(cfg.precision, device)
        self.task = task = check_job(job, self.task)

        seed_everything(cfg.seed)  # identical initial weights on every rank
        model = task.build_model().to(device)
        train_ds, val_ds = task.build_data()
        sampler = GlobalBatchSampler(
            len(train_ds),  # type: ignore[arg-type]
            cfg.effective_batch_size,
            cfg.per_device_batch_size,
            ctx,
            seed=cfg.seed,
        )
        # A private generator: each iter(DataLoader) must not draw from the global RNG.
        loader_gen = torch.Generator().manual_seed(cfg.seed)
        loader = DataLoader(
            train_ds, batch_sampler=sampler, generator=loader_gen, pin_memory=device.type == "cuda"
        )
        val_loader = self._val_loader(val_ds, cfg)
        total = cfg.total_steps(len(train_ds))  # type: ignore[arg-type]
        if total < 1:
            raise ConfigError(
                f"field 'training.global_batch_size': the training set ({len(train_ds)} "  # type: ignore[arg-type]
                f"samples) holds no global batch of {cfg.effective_batch_size}: lower "
                "training.global_batch_size",
                "training.global_batch_size",
            )

        self._speed_up(model, device, precision)
        prepared = self._prepare(model, device, cfg, total)
        wrapped, steps = prepared.model, prepared.steps
        scheduler = linear_warmup_cosine_lr(
            prepared.optimizer, cfg.warmup_steps, total, cfg.min_lr_ratio
        )
        ckpt = CheckpointManager(
            job.checkpoint_dir,
            ctx=ctx,
            keep_last_n=job.checkpoint.keep_last_n,
            config_hash=job.config_hash(),
            config=job.to_dict(),
            trust_checkpoint=self.trust_checkpoint,
        )
        run = _Run(
            model=wrapped,
            optimizer=prepared.optimizer,
            scheduler=scheduler,
            amp=prepared.trainer,
            sampler=sampler,
            generators={"loader": loader_gen},
            kind=job.strategy.checkpoint_format,
            engine=prepared.engine,
        )
        seed_everything(cfg.seed, rank=ctx.rank)  # per-rank streams (dropout)
        step = self._resume(ckpt, run)
        self.state = TrainerState(step=step, total_steps=total)

        out_dir = Path(job.run.output_dir)
        writer = MetricsWriter(
            out_dir,
            tensorboard=job.run.tensorboard,
            enabled=ctx.is_main_process,
            resume_step=step,  # what a crash logged after the checkpoint is logged again
            trackers=job.run.trackers,
            params=tracker_params(job.to_dict(), ctx.world_size, device),
            run_ids=self._tracker_runs or None,  # set by _load when resuming
        )
        # into every checkpoint, so a resumed job continues the same tracker runs
        self._tracker_runs = writer.run_ids
        meter = ThroughputMeter(
            flops_per_token=task.flops_per_token,
            peak_tflops=job.run.peak_tflops,
            world_size=ctx.world_size,
            device=device,
            precision=precision,
        )
        samples_per_step = cfg.per_device_batch_size * cfg.gradient_accumulation_steps
        tokens_per_step = samples_per_step * (task.tokens_per_sample or 0)
        self._announce(cfg, precision, total, step, ckpt, writer, task)
        self._emit("on_train_start")
        started = time.perf_counter()
        first_loss = math.nan
        last_saved = start_step = step
        try:
            with (
                PreemptionHandler(ctx=ctx) as preemption,
                self._progress(total, step) as advance,
                self._watchdog(ctx) as watchdog,
            ):
                # Device-side values, read once per log window: no host sync per step.
                losses: list[torch.Tensor] = []  # micro-batch losses of the log window
                norms: list[torch.Tensor] = []
                loss_fn = task.loss_sum or task.loss_fn
                count_fn = task.count_targets or count_scored
                meter.start()
                while step < total and not self.state.preempted:
                    for batches in step_batches(loader, cfg.gradient_accumulation_steps):
                        norm, micro_losses = train_step(
                            batches,
                            wrapped,
                            loss_fn,
                            steps,
                            ctx=ctx,
                            device=device,
                            seed=cfg.seed,
                            step=step,
                            count_fn=count_fn,
                            check_counts=step == start_step,
                        )
                        losses += micro_losses
                        if norm is None:  # pragma: no cover - every step_async steps at A
                            raise RuntimeError("the strategy did not step at the last micro-batch")
                        scheduler.step()
                        step += 1
                        self.state.step = step
                        watchdog.tick(step)
                        advance()
                        log_step = step % job.run.log_every == 0 or step == total
                        # Clipping measures every step's norm anyway; without it only the
                        # log step's is measured (read before the next forward).
                        if norm.computed or log_step:
                            norms.append(norm.tensor())
                        meter.update(samples_per_step, tokens_per_step)
                        if log_step:
                            window_loss = torch.stack(losses).double().mean()
                            metrics = reduce_scalar_dict({"loss": window_loss}, ctx)
                            metrics.update(
                                lr=float(scheduler.get_last_lr()[0]),
                                grad_norm=_mean_finite(norms),
                                skipped_steps=float(run.amp.skipped_steps if run.amp else 0),
                            )
                            metrics.update(meter.compute().to_metrics())
                            if math.isnan(first_loss):
                                first_loss = metrics["loss"]
                            self.state.last_metrics = metrics
                            writer.write("train", step, metrics)
                            self._log_line(step, total, metrics)
                            self._emit("on_log", metrics)
                            losses.clear()
                            norms.clear()
                        if val_loader is not None and (
                            step % job.run.eval_every == 0 or step == total
                        ):
                            val = self._evaluate(wrapped, val_loader, device, steps.autocast)
                            watchdog.tick(step)  # a long evaluation is not a stall
                            self.state.val_metrics = val
                            writer.write("val", step, val)
                            self.print(f"step {step}/{total} | val loss {val['loss']:.4f}")
                            self._emit("on_eval", val)
                        # A collective (~0.5 ms on gloo): ask at log steps only, the same
                        # steps on every rank; a scheduler's warning leaves ample time.
                        stop = step % job.run.log_every == 0 and preemption.should_stop()
                        if step % job.checkpoint.every == 0 or step == total or stop:
                            path = self._save(ckpt, run, step)
                            watchdog.tick(step)
                            last_saved = step
                            self._emit("on_checkpoint", path)
                        if stop:
                            self.state.preempted = True
                            self.print(
                                f"preempted by {preemption.received.name if preemption.received else 'a signal on another rank'}: "
                                f"saved step {step}"
                            )
                            break
                        if step >= total:
                            break
                    else:
                        sampler.set_epoch(sampler.epoch + 1)
                if step > last_saved:  # e.g. resumed at the end: nothing new to save
                    self._save(ckpt, run, step)
        finally:
            ckpt.wait()  # an async save in flight must commit before the run ends
            writer.close()
        summary = {
            "step": float(step),
            "first_loss": first_loss,
            "train_loss": self.state.last_metrics.get("loss", math.nan),
            "val_loss": self.state.val_metrics.get("loss", math.nan),
            "baseline": task.baseline if task.baseline is not None else math.nan,
            "seconds": time.perf_counter() - started,
            "preempted": float(self.state.preempted),
        }
        if ctx.is_main_process and job.run.plot and writer.path.exists():
            png = plot_metrics(writer.path, out_dir / "loss.png", baseline=task.baseline)
            if png is not None:
                self.print(f"plot: {png}")
        self._emit("on_train_end", summary)
        del wrapped, model, run, prepared  # free DDP's reducer before the group goes (DESIGN.md)
        return {k: float(v) for k, v in summary.items()}

    # --- pieces of the run --------------------------------------------------------------

    def _val_loader(
        self, val_ds: Dataset[Any] | None, cfg: TrainingConfig
    ) -> DataLoader[Any] | None:
        """This rank's share of the evaluated samples: every ``world_size``-th, no padding.

        ``run.eval_batches`` counts global batches, so the same samples are evaluated on any
        number of ranks (``DistributedSampler`` would pad the last round with repeats).
        """
        if val_ds is None or len(val_ds) == 0:  # type: ignore[arg-type]
            return None
        size = len(val_ds)  # type: ignore[arg-type]
        limit = self.job.run.eval_batches
        if limit is not None:
            size = min(size, limit * cfg.effective_batch_size)
        world, per_device = self.ctx.world_size, cfg.per_device_batch_size
        shard = list(range(self.ctx.rank, size, world))
        # the largest share's batches: every rank runs this many forwards (see _evaluate)
        self._val_rounds = math.ceil(math.ceil(size / world) / per_device)
        return DataLoader(val_ds, batch_size=per_device, sampler=shard)

    def _resume(self, ckpt: CheckpointManager, run: _Run) -> int:
        """Loads the newest checkpoint, or refuses in one line (:class:`ResumeError`).

        Every rank decides alike, without a collective: the checks read the shared
        directory. Damaged checkpoints newer than the newest intact one are never skipped
        (the run would overwrite them at their step): the run stops and names them.
        """
        if not self.job.checkpoint.resume:
            return 0
        found = ckpt.find_resumable()
        refusal = found.refusal(ckpt.directory)
        if refusal is not None:
            raise ResumeError(refusal)
        chosen = found.latest
        if chosen is None:
            return 0
        for line in check_resumable(
            self.job, chosen, ckpt.manifest(chosen), allow_config_change=self.allow_config_change
        ):
            self.print(f"warning: {line}")
        try:
            step = self._load(ckpt, run, chosen)
        except CheckpointError as err:  # checksums, allow-lists, shapes: the user's to fix
            again = ckpt.find_resumable(verify_checksums=True)  # the failure path only
            refusal = again.refusal(ckpt.directory)
            raise ResumeError(refusal or f"cannot resume from {chosen}: {err}") from None
        except RuntimeError as err:
            if "Error(s) in loading state_dict" not in str(err):
                raise
            first = next((ln.strip() for ln in str(err).splitlines()[1:] if ln.strip()), "")
            raise ResumeError(
                f"cannot resume from {chosen}: it was written by a model of another shape "
                f"({first[:300]}); use the task options it was written with, or another "
                "checkpoint.dir for a new run"
            ) from None
        self.print(f"resumed from {chosen} (step {step})")
        return step

    def _load(self, ckpt: CheckpointManager, run: _Run, chosen: Path) -> int:
        if run.kind == "torch":
            state = ckpt.load(chosen)
            saved = state.get("extra") or {}
            self._tracker_runs = dict(saved.get("trackers") or {})
            return restore_training_state(
                state,
                self.ctx,
                run.model,
                run.optimizer,
                scheduler=run.scheduler,
                amp=run.amp,
                sampler=run.sampler,
                generators=run.generators,
                seed=self.config.seed,
            )
        # model and optimizer come back through their own format; the rest is plain, and
        # comes back through the same function as for the plain format
        if run.kind == "deepspeed":
            extra = ckpt.load_deepspeed(run.engine, chosen)
        else:
            extra = ckpt.load_sharded(run.model, run.optimizer, chosen)
        self._tracker_runs = dict(extra.get("trackers") or {})
        return restore_run_state(
            extra,
            self.ctx,
            scheduler=run.scheduler,
            amp=run.amp,
            sampler=run.sampler,
            generators=run.generators,
            seed=self.config.seed,
        )

    def _watchdog(self, ctx: DistributedContext) -> StallWatchdog:
        """``run.stall_timeout``, else ``GPU_TRAINING_STALL_TIMEOUT``, else none."""
        timeout = self.job.run.stall_timeout
        return StallWatchdog.from_env(ctx) if timeout is None else StallWatchdog(timeout, ctx=ctx)

    def _task_extra(self, model: nn.Module) -> dict[str, Any]:
        """What the task puts in every checkpoint (a Hugging Face model: what export needs)."""
        if self._extra is None:
            from gpu_training.tasks.hf import checkpoint_extra, is_pretrained_model

            inner = unwrap_model(model)
            make = self.task.checkpoint_extra if self.task is not None else None
            if make is None and is_pretrained_model(inner):  # a PreTrainedModel by import string
                make = checkpoint_extra
            self._extra = make(inner) if make is not None else {}
        return self._extra

    def _save(self, ckpt: CheckpointManager, run: _Run, step: int) -> Path | None:
        if run.kind == "torch":
            state = capture_training_state(
                self.ctx,
                run.model,
                run.optimizer,
                step=step,
                scheduler=run.scheduler,
                amp=run.amp,
                sampler=run.sampler,
                generators=run.generators,
                extra={"trackers": self._tracker_runs, **self._task_extra(run.model)},
            )
            return ckpt.save(state, step=step)
        extra: dict[str, Any] = {
            **self._task_extra(run.model),
            **capture_run_state(
                self.ctx,
                step=step,
                scheduler=run.scheduler,
                amp=run.amp,
                sampler=run.sampler,
                generators=run.generators,
            ),
            "trackers": self._tracker_runs,
        }
        if run.kind == "deepspeed":
            return ckpt.save_deepspeed(run.engine, step, extra=extra)
        return ckpt.save_sharded(run.model, run.optimizer, step, extra=extra)

    def _announce(
        self,
        cfg: TrainingConfig,
        precision: str,
        total: int,
        step: int,
        ckpt: CheckpointManager,
        writer: MetricsWriter,
        task: Task,
    ) -> None:
        strategy = self.job.strategy
        lines = [
            f"task: {task.name}" + (f" ({task.describe})" if task.describe else ""),
            cfg.describe(),
            f"strategy: {strategy.name} on {self.ctx.world_size} rank(s)"
            + (f", backend {self.ctx.backend}" if self.ctx.backend else "")
            + f", precision {precision}",
            f"steps: {total} (starting at {step})",
            f"checkpoints: {ckpt.directory} (every {self.job.checkpoint.every}, keep "
            f"{self.job.checkpoint.keep_last_n})",
            f"metrics: {writer.path}"
            + (f", TensorBoard: {writer.tensorboard_dir}" if writer.tensorboard_dir else ""),
        ]
        if writer.trackers:
            lines.append(f"trackers: {writer.trackers}")
        if task.baseline is not None:
            lines.append(f"baseline loss: {task.baseline:.4f}")
        if step >= total:
            lines.append(
                f"run already complete at step {step}: delete {ckpt.directory} to start over"
            )
        self.print("\n".join(lines))

    def _log_line(self, step: int, total: int, metrics: dict[str, float]) -> None:
        self.print(
            f"step {step}/{total} | loss {metrics['loss']:.4f} | lr {metrics['lr']:.2e} | "
            f"grad_norm {metrics['grad_norm']:.3f} | "
            f"{metrics['global_samples_per_s']:.0f} samples/s"
            + (f" | {metrics['global_tokens_per_s']:.0f} tok/s" if metrics["tokens_per_s"] else "")
            + (f" | MFU {metrics['mfu']:.1%}" if "mfu" in metrics else "")
        )

    @contextlib.contextmanager
    def _progress(self, total: int, start: int) -> Iterator[Any]:
        """A rich progress bar on rank 0 when attached to a terminal; a no-op elsewhere."""
        show = (
            self.ctx.is_main_process
            and self.job.run.progress
            and not self.quiet
            and sys.stdout.isatty()
        )
        if not show:
            yield lambda: None
            return
        from rich.progress import Progress

        with Progress(transient=True) as progress:
            bar = progress.add_task("training", total=total, completed=start)
            yield lambda: progress.advance(bar)
