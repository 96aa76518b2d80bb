"""gpu_training: take a PyTorch training job from one GPU to many — correctly, and fast.

Submodules are imported lazily, so ``import gpu_training`` (and ``gpu-training --help``)
does not pay for ``import torch``. Everything in ``__all__`` resolves on first access::

    import gpu_training as gt
    ctx = gt.init_distributed()          # imports gpu_training.ddp (and torch) here
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_training._lazy import lazy_exports

__version__ = "0.1.0"

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    # config (no torch)
    "TrainingConfig": "config",
    "ConfigError": "config",
    "load_config": "config",
    "gradient_accumulation_for_target": "config",
    "accumulation_plan": "config",
    "scale_lr": "config",
    # ddp
    "DistributedContext": "ddp",
    "init_distributed": "ddp",
    "cleanup_distributed": "ddp",
    "resolve_device": "ddp",
    "make_distributed_sampler": "ddp",
    "reduce_scalar_dict": "ddp",
    "unwrap_model": "ddp",
    "train_one_epoch": "ddp",
    # amp
    "MixedPrecisionStepper": "amp",
    "MixedPrecisionTrainer": "amp",
    "GradNorm": "amp",
    "needs_grad_scaler": "amp",
    "resolve_precision": "amp",
    "should_step": "amp",
    # schedule
    "linear_warmup_cosine_lr": "schedule",
    # launcher (no torch)
    "single_node_command": "launcher",
    "multi_node_commands": "launcher",
    "launch_argv": "launcher",
    "run_torchrun": "launcher",
    "sbatch_script": "launcher.slurm",
    "pytorchjob_manifest": "launcher.k8s",
    # checkpoint
    "CheckpointManager": "checkpoint",
    "CheckpointError": "checkpoint",
    "strip_wrapper_prefixes": "checkpoint",
    # data
    "GlobalBatchSampler": "data",
    "SamplerConfigError": "data",
    "global_batch_plan": "data",
    "SampleStream": "streaming",
    "StreamPosition": "streaming",
    "build_train_data": "train_data",
    # rng / resume
    "seed_everything": "rng",
    "capture_rng_state": "rng",
    "restore_rng_state": "rng",
    "capture_training_state": "resume",
    "restore_training_state": "resume",
    "capture_run_state": "resume",
    "restore_run_state": "resume",
    # preemption
    "PreemptionHandler": "preemption",
    "EXIT_PREEMPTED": "preemption",
    "exit_preempted": "preemption",
    # job / trainer
    "JobConfig": "job",
    "load_job": "job",
    "Trainer": "trainer",
    # profiling
    "find_max_batch_size": "profiling",
    "search_max_batch_size": "profiling",
    "make_fits": "profiling",
    "BatchSizeError": "profiling",
    "ThroughputMeter": "profiling",
    "flops_per_token": "profiling",
    "peak_tflops": "profiling",
    "profile_steps": "profiling",
    # memory
    "MemoryEstimate": "memory",
    "TransformerShape": "memory",
    "clear_cuda_cache": "memory",
    "estimate_memory": "memory",
    "explain_oom": "memory",
    "format_bytes": "memory",
    "memory_tracking": "memory",
    "profile_memory": "memory",
    # monitor (no torch)
    "GPUState": "monitor",
    "detect_anomalies": "monitor",
    "query_gpus": "monitor",
    "query_nvidia_smi": "monitor",
    # per-rank step telemetry (torch imported when used)
    "RankTelemetry": "telemetry",
    "read_rank_logs": "telemetry",
    "straggler": "telemetry",
    # diagnostics (lint and doctor import no torch until run)
    "lint_paths": "diagnostics",
    "lint_source": "diagnostics",
    "verify_setup": "diagnostics",
    "run_verify": "diagnostics",
    "assert_grads_in_sync": "diagnostics",
    "run_doctor": "diagnostics",
    # the stall watchdog and entry point (torch imported when used)
    "StallWatchdog": "watchdog",
    "enable_debug_mode": "watchdog",
    "entry_point": "watchdog",
    "monitored_barrier": "watchdog",
}

__all__ = ["__version__", *_EXPORTS]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from gpu_training.amp import (
        GradNorm,
        MixedPrecisionStepper,
        MixedPrecisionTrainer,
        needs_grad_scaler,
        resolve_precision,
        should_step,
    )
    from gpu_training.checkpoint import (
        CheckpointError,
        CheckpointManager,
        strip_wrapper_prefixes,
    )
    from gpu_training.config import (
        ConfigError,
        TrainingConfig,
        accumulation_plan,
        gradient_accumulation_for_target,
        load_config,
        scale_lr,
    )
    from gpu_training.data import GlobalBatchSampler, SamplerConfigError, global_batch_plan
    from gpu_training.ddp import (
        DistributedContext,
        cleanup_distributed,
        init_distributed,
        make_distributed_sampler,
        reduce_scalar_dict,
        resolve_device,
        train_one_epoch,
        unwrap_model,
    )
    from gpu_training.job import JobConfig, load_job
    from gpu_training.launcher import (
        launch_argv,
        multi_node_commands,
        run_torchrun,
        single_node_command,
    )
    from gpu_training.launcher.k8s import pytorchjob_manifest
    from gpu_training.launcher.slurm import sbatch_script
    from gpu_training.memory import (
        MemoryEstimate,
        TransformerShape,
        clear_cuda_cache,
        estimate_memory,
        explain_oom,
        format_bytes,
        memory_tracking,
        profile_memory,
    )
    from gpu_training.monitor import GPUState, detect_anomalies, query_gpus, query_nvidia_smi
    from gpu_training.preemption import EXIT_PREEMPTED, PreemptionHandler, exit_preempted
    from gpu_training.profiling import (
        BatchSizeError,
        ThroughputMeter,
        find_max_batch_size,
        flops_per_token,
        make_fits,
        peak_tflops,
        profile_steps,
        search_max_batch_size,
    )
    from gpu_training.resume import (
        capture_run_state,
        capture_training_state,
        restore_run_state,
        restore_training_state,
    )
    from gpu_training.rng import capture_rng_state, restore_rng_state, seed_everything
    from gpu_training.schedule import linear_warmup_cosine_lr
    from gpu_training.streaming import SampleStream, StreamPosition
    from gpu_training.telemetry import RankTelemetry, read_rank_logs, straggler
    from gpu_training.train_data import build_train_data
    from gpu_training.trainer import Trainer
