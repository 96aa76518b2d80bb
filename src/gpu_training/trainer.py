"""The main job: ``Trainer(job).fit()`` composes the helpers into one correct training run.

context → task (model, data) → world-size-invariant sampler → strategy wrapping →
MixedPrecisionStepper → warmup-cosine schedule → CheckpointManager (auto-resume) → step loop
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

import math
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from gpu_training.amp import MixedPrecisionStepper, nonfinite_warning, resolve_precision
from gpu_training.checkpoint import CheckpointError, CheckpointManager
from gpu_training.config import TrainingConfig
from gpu_training.ddp import (
    DistributedContext,
    cleanup_distributed,
    init_distributed,
    process_group_up,
    reduce_scalar_dict,
    resolve_device,
    unwrap_model,
)
from gpu_training.evaluation import EvalShard, eval_shard, evaluate
from gpu_training.job import JobConfig
from gpu_training.log_window import LogWindow, guarded_skips, mean_finite
from gpu_training.nonfinite import skipped_now
from gpu_training.preemption import PreemptionHandler
from gpu_training.reporting import (
    MetricsWriter,
    log_line,
    plot_metrics,
    progress_bar,
    run_banner,
    run_outputs,
)
from gpu_training.resume import (
    ResumeError,
    capture_run_state,
    check_resumable,
    layout_change,
    restore_run_state,
)
from gpu_training.rng import seed_everything
from gpu_training.schedule import linear_warmup_cosine_lr
from gpu_training.step import step_batches, train_step
from gpu_training.strategy import check_job, data_parallel_context
from gpu_training.strategy.prepared import Prepared, prepare
from gpu_training.tasks import Task, build_task, count_scored, task_checkpoint_extra
from gpu_training.telemetry import TelemetryOff, open_telemetry
from gpu_training.throughput import ThroughputMeter, mfu_note
from gpu_training.trackers import tracker_params
from gpu_training.train_data import DataPosition, build_train_data
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


@dataclass
class _Run:
    """What one run's step loop, checkpoints and resume share (built by ``Trainer._setup``)."""

    cfg: TrainingConfig
    """The training section for this world size."""
    task: Task
    device: torch.device
    precision: str
    prepared: Prepared
    """The wrapped model, optimizer and step functions; it saves and loads itself."""
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: DataPosition  # a sampler's epoch and position, or a stream's cursor
    loader: Iterable[Any]
    generators: dict[str, torch.Generator]
    """Private generators whose state checkpoints carry (the loader's)."""
    val: EvalShard | None
    ckpt: CheckpointManager
    total: int
    """Optimizer steps of the whole run."""
    telemetry: TelemetryOff  # this rank's step records (run.telemetry), or marks doing nothing

    @property
    def amp(self) -> MixedPrecisionStepper | None:
        """None under DeepSpeed (the engine owns precision and clipping)."""
        return self.prepared.stepper


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

    @property
    def _shows_progress(self) -> bool:
        return self.ctx.is_main_process and self.job.run.progress and not self.quiet

    def _prepare(
        self, model: nn.Module, device: torch.device, cfg: TrainingConfig, total: int
    ) -> Prepared:
        def make_optimizer(params: Any) -> torch.optim.Optimizer:
            return torch.optim.AdamW(
                [p for p in params if p.requires_grad],  # frozen (LoRA base): no state
                lr=cfg.scaled_learning_rate,
                weight_decay=cfg.weight_decay,
                fused=device.type in ("cuda", "cpu"),
            )

        return prepare(
            model,
            self.job.strategy,
            self.ctx,
            cfg,
            device=device,
            optimizer=make_optimizer,
            total_steps=total,
            compile=self.job.run.compile,
            tf32=self.job.run.tf32,
        )

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
        self.ctx = init_distributed(record_collectives=self.job.run.stall_timeout is not None)
        try:
            return self._fit()
        except BaseException as exc:
            if self.ctx.is_distributed:
                # The run's objects live on in the traceback, DDP's reducer holding the group:
                # freed, the teardown below closes it and the peers stop at once
                # (docs/design.md, "Traps").
                traceback.clear_frames(exc.__traceback__)
            raise
        finally:
            if owns_group:
                cleanup_distributed()  # no barrier with an exception in flight

    def _fit(self) -> dict[str, float]:
        """Setup, resume, the step loop, and the summary."""
        run = self._setup()
        step = self._resume(run)
        self.state = TrainerState(step=step, total_steps=run.total)
        job, ctx, task = self.job, self.ctx, run.task
        out_dir = Path(job.run.output_dir)
        writer = MetricsWriter(
            out_dir,
            tensorboard=job.run.tensorboard,
            enabled=ctx.is_main_process,
            resume_step=step,  # what a crash logged after the checkpoint is logged again
            trackers=job.run.trackers,
            params=tracker_params(job.to_dict(), ctx.world_size, run.device),
            run_ids=self._tracker_runs or None,  # set by _resume
        )
        self._tracker_runs = writer.run_ids  # in every checkpoint: a resume continues them
        self._announce(run, step, writer)
        self._emit("on_train_start")
        started = time.perf_counter()
        window = LogWindow(start_step=step, last_saved=step, skipped_before=guarded_skips(run.amp))
        try:
            step = self._loop(run, writer, window, step)
        finally:
            run.ckpt.wait()  # an async save in flight must commit before the run ends
            writer.close()
            run.telemetry.close()
        summary = {
            "step": float(step),
            "first_loss": window.first_loss,
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
        del run  # free DDP's reducer before the group goes (docs/design.md, "Traps")
        return {k: float(v) for k, v in summary.items()}

    def _setup(self) -> _Run:
        """Task, data, sampler, the wrapped model, its optimizer and schedule, checkpoints."""
        job, ctx = self.job, data_parallel_context(self.ctx, self.job.strategy.tensor_parallel)
        device = resolve_device(ctx)
        cfg = job.training.for_world_size(ctx.world_size)
        self.config = cfg
        precision = resolve_precision(cfg.precision, device)
        self.task = task = check_job(job, self.task)

        seed_everything(cfg.seed)  # identical initial weights on every rank
        model = task.build_model().to(device)
        train_ds, val_ds = task.build_data()
        data = build_train_data(
            train_ds, cfg, ctx, workers=task.loader_workers, pin_memory=device.type == "cuda"
        )  # map-style or a stream
        val = None
        if val_ds is not None and len(val_ds) > 0:  # type: ignore[arg-type]
            # run.eval_batches counts global batches: the same samples on any world size
            limit = job.run.eval_batches
            val = eval_shard(
                val_ds,
                ctx,
                cfg.per_device_batch_size,
                None if limit is None else limit * cfg.effective_batch_size,
            )
        total = data.total

        prepared = self._prepare(model, device, cfg, total)
        scheduler = linear_warmup_cosine_lr(
            prepared.optimizer, cfg.warmup_steps, total, cfg.min_lr_ratio
        )
        ckpt = CheckpointManager(
            job.checkpoint_dir,
            ctx=self.ctx,
            keep_last_n=job.checkpoint.keep_last_n,
            config_hash=job.config_hash(),
            # the split that ran (world size, accumulation); the hash leaves the split out
            config={**job.to_dict(), "training": cfg.to_dict()},
            trust_checkpoint=self.trust_checkpoint,
        )
        telemetry = open_telemetry(job, self.ctx, device, total, model=prepared.model)  # hooks it
        seed_everything(cfg.seed, rank=ctx.rank)  # per-rank streams (dropout)
        return _Run(
            cfg=cfg,
            task=task,
            device=device,
            precision=precision,
            prepared=prepared,
            scheduler=scheduler,
            sampler=data.position,
            loader=data.loader,
            generators=data.generators,
            val=val,
            ckpt=ckpt,
            total=total,
            telemetry=telemetry,
        )

    def _loop(self, run: _Run, writer: MetricsWriter, window: LogWindow, step: int) -> int:
        """Optimizer steps until the end of the run or a preemption; returns the last step."""
        ctx, cfg, task, tp = self.ctx, run.cfg, run.task, self.job.strategy.tensor_parallel
        meter = ThroughputMeter(  # a TP group's ranks share its samples and their FLOPs
            flops_per_token=task.flops_per_token and task.flops_per_token / tp,
            peak_tflops=self.job.run.peak_tflops,
            world_size=ctx.world_size // tp,
            device=run.device,
            precision=run.precision,
        )
        loss_fn = task.loss_sum or task.loss_fn
        count_fn = task.count_targets or count_scored
        samples = cfg.per_device_batch_size * cfg.gradient_accumulation_steps  # a rank's, a step
        timeout, on_stall = self.job.run.stall_timeout, run.telemetry.stalled  # its verdict too
        out = self.job.run.output_dir
        # Read once: the step below runs every few hundred µs on a tiny model.
        log_every, every, total = self.job.run.log_every, self.job.checkpoint.every, run.total
        eval_every = self.job.run.eval_every if run.val is not None else 0
        model, steps, amp, tel = run.prepared.model, run.prepared.steps, run.amp, run.telemetry
        dp_ctx, tokens = data_parallel_context(ctx, tp), samples * (task.tokens_per_sample or 0)
        cadence = self._cadence
        with (
            PreemptionHandler(ctx=ctx) as preemption,
            progress_bar(total, step, enabled=self._shows_progress) as advance,
            StallWatchdog(timeout, ctx=ctx, on_stall=on_stall, dump_dir=out)  # the field,
            if timeout is not None  # else GPU_TRAINING_STALL_TIMEOUT, else none
            else StallWatchdog.from_env(ctx, on_stall=on_stall, dump_dir=out) as watchdog,
        ):
            meter.start()
            while step < total and not self.state.preempted:
                loader = tel.batches(run.loader)  # each request timed as data wait
                for batches in step_batches(loader, cfg.gradient_accumulation_steps):
                    norm, micro_losses = train_step(
                        batches,
                        model,
                        loss_fn,
                        steps,
                        ctx=dp_ctx,
                        device=run.device,
                        seed=cfg.seed,
                        step=step,
                        count_fn=count_fn,
                        check_counts=step == window.start_step,
                        telemetry=tel,
                    )
                    if norm is None:  # pragma: no cover - every step_async steps at A
                        raise RuntimeError("the strategy did not step at the last micro-batch")
                    step += 1  # NaN flags left on a GPU: read where it syncs (log, save, end)
                    settle = step % log_every == 0 or step % every == 0 or step == total
                    bad = settle or (amp is not None and amp.last_nonfinite is not None)
                    warning = nonfinite_warning(amp, step, settle=settle) if bad else None
                    if warning:
                        self.print(warning)
                    if warning is None or not skipped_now(amp):  # a skipped step's NaN loss
                        window.losses += micro_losses  # stays out of the mean
                    run.scheduler.step()
                    self.state.step = step
                    watchdog.tick(step)
                    advance()
                    # Clipping measures every step's norm anyway; without it only the
                    # log step's is measured (read before the next forward).
                    if warning is None and (
                        norm.computed or step % log_every == 0 or step == total
                    ):
                        window.norms.append(norm.tensor())
                    meter.update(samples, tokens)
                    due = settle or (eval_every and step % eval_every == 0)  # else nothing to do
                    if due and cadence(run, writer, window, meter, watchdog, preemption, step):
                        break
                else:
                    run.sampler.set_epoch(run.sampler.epoch + 1)
            if step > window.last_saved:  # e.g. resumed at the end: nothing new to save
                self._save(run, step)
        return step

    def _cadence(
        self,
        run: _Run,
        writer: MetricsWriter,
        window: LogWindow,
        meter: ThroughputMeter,
        watchdog: StallWatchdog,
        preemption: PreemptionHandler,
        step: int,
    ) -> bool:
        """Logs, evaluates and saves as the job asks after ``step``; True ends the loop."""
        job = self.job
        if step % job.run.log_every == 0 or step == run.total:
            self._log(run, writer, window, meter, step)
        if run.val is not None and (step % job.run.eval_every == 0 or step == run.total):
            model, autocast = run.prepared.model, run.prepared.steps.autocast
            loss_fn = run.task.loss_sum or run.task.loss_fn
            val = evaluate(model, run.val, self.ctx, loss_fn, run.device, autocast)
            watchdog.tick(step)  # a long evaluation is not a stall
            self.state.val_metrics = val
            writer.write("val", step, val)
            self.print(f"step {step}/{run.total} | val loss {val['loss']:.4f}")
            self._emit("on_eval", val)
        # A collective: at log steps only, the same on every rank (a scheduler warns in time).
        stop = step % job.run.log_every == 0 and preemption.should_stop()
        if step % job.checkpoint.every == 0 or step == run.total or stop:
            run.telemetry.flush()  # the rows up to a checkpoint are on disk before it commits
            path = self._save(run, step)
            watchdog.tick(step)
            window.last_saved = step
            self._emit("on_checkpoint", path)
        if stop:
            self.state.preempted = True
            signal = preemption.received.name if preemption.received else None
            self.print(f"preempted by {signal or 'a signal on another rank'}: saved step {step}")
            return True
        return step >= run.total

    def _log(
        self,
        run: _Run,
        writer: MetricsWriter,
        window: LogWindow,
        meter: ThroughputMeter,
        step: int,
    ) -> None:
        """The log window's metrics, reduced over the ranks: written, printed, emitted."""
        skips = guarded_skips(run.amp)  # a skip in the window: non-finite losses left out
        metrics = reduce_scalar_dict({"loss": window.loss(skips)}, self.ctx)
        metrics.update(
            lr=float(run.scheduler.get_last_lr()[0]),
            grad_norm=mean_finite(window.norms),
            skipped_steps=float(run.amp.skipped_steps if run.amp else 0),
        )
        metrics.update(meter.compute().to_metrics())
        if math.isnan(window.first_loss):
            window.first_loss = metrics["loss"]
        self.state.last_metrics = metrics
        # metrics.jsonl at once (a stalled run's last row must show); telemetry a second apart
        writer.write("train", step, metrics)
        if self.ctx.is_main_process and not self.quiet:
            self.print(log_line(step, run.total, metrics))
        self._emit("on_log", metrics)
        if window.clock.due():
            run.telemetry.flush()  # this rank's records since the last write, in its own file
        window.clear(skips)

    # --- pieces of the run --------------------------------------------------------------

    def _resume(self, run: _Run) -> int:
        """Loads the newest checkpoint, or refuses in one line (:class:`ResumeError`).

        Every rank decides alike, without a collective: the checks read the shared
        directory. Damaged checkpoints newer than the newest intact one are never skipped
        (the run would overwrite them at their step): the run stops and names them.
        """
        if not self.job.checkpoint.resume:
            return 0
        ckpt = run.ckpt
        found = ckpt.find_resumable()
        if (refusal := found.refusal(ckpt.directory)) is not None:
            raise ResumeError(refusal)
        if (chosen := found.latest) is None:
            return 0
        manifest = ckpt.manifest(chosen)
        allow = self.allow_config_change
        for line in check_resumable(self.job, chosen, manifest, allow_config_change=allow):
            self.print(f"warning: {line}")
        try:
            step = self._load(run, chosen)
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
        change = layout_change(self.job, manifest, self.ctx.world_size)
        self.print(f"resumed from {chosen} (step {step}{f' {change}' if change else ''})")
        return step

    def _load(self, run: _Run, chosen: Path) -> int:
        """The model and optimizer through the strategy's format; the rest the same for all."""
        run_state, extra = run.prepared.load_checkpoint(run.ckpt, chosen)
        self._tracker_runs = dict(extra.get("trackers") or {})
        return restore_run_state(
            run_state,
            self.ctx,
            scheduler=run.scheduler,
            amp=run.amp,
            sampler=run.sampler,
            generators=run.generators,
            seed=run.cfg.seed,
        )

    def _save(self, run: _Run, step: int) -> Path | None:
        run_state = capture_run_state(
            self.ctx,
            step=step,
            scheduler=run.scheduler,
            amp=run.amp,
            sampler=run.sampler,
            generators=run.generators,
        )
        extra = {"trackers": self._tracker_runs, **self._task_extra(run.prepared.model)}
        with run.telemetry.checkpoint():
            return run.prepared.save_checkpoint(run.ckpt, run_state, extra)

    def _task_extra(self, model: nn.Module) -> dict[str, Any]:
        """What the task puts in every checkpoint (a Hugging Face model: what export needs)."""
        if self._extra is None:
            self._extra = task_checkpoint_extra(self.task, unwrap_model(model))
        return self._extra

    def _announce(self, run: _Run, step: int, writer: MetricsWriter) -> None:
        strategy, ckpt = self.job.strategy, self.job.checkpoint
        mfu = run.device.type == "cuda" and mfu_note(
            run.device, run.precision, self.job.run.peak_tflops, run.task.flops_per_token
        )
        backend = f", backend {self.ctx.backend}" if self.ctx.backend else ""
        where = f"{strategy.name} on {self.ctx.world_size} rank(s){backend}"
        every = f"every {ckpt.every}, keep {ckpt.keep_last_n}"
        strategy_line = f"{where}, precision {run.precision}"
        lines = run_banner(run.task, run.cfg.describe(), strategy_line, step, run.total)
        lines += run_outputs(run.ckpt.directory, every, writer, step if step >= run.total else None)
        self.print("\n".join(lines + ([mfu] if mfu else [])))
