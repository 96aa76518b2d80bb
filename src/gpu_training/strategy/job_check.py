"""A job's strategy checked against its task before any process starts.

:func:`check_job` resolves the task a job names and checks the strategy's options against
it: a DeepSpeed config that would fight the Trainer over the learning rate, the deepspeed extra
missing, FSDP ``block_classes`` the model does not have, a tensor-parallel plan the model does
not ship or does not fit. The model is built on the ``meta`` device, so the check costs no
memory and no weights; ``train`` runs it on the launching host (:mod:`~gpu_training.preflight`)
and the Trainer again on every rank.

Example:
    >>> from gpu_training.job import JobConfig
    >>> job = JobConfig.from_dict({"task": "charlm", "strategy": {"name": "fsdp",
    ...                            "block_classes": ["NoSuchBlock"]}})
    >>> try:
    ...     check_job(job)
    ... except Exception as exc:
    ...     print(type(exc).__name__)
    StrategyError
"""

from __future__ import annotations

from gpu_training.job import JobConfig
from gpu_training.meta_device import meta_device
from gpu_training.strategy.spec import StrategyError
from gpu_training.strategy.tensor_parallel import check_plan, resolve_plan
from gpu_training.strategy.wrap import find_blocks
from gpu_training.tasks import Task, build_task

__all__ = ["check_job"]


def check_job(job: JobConfig, task: Task | None = None) -> Task:
    """Resolve the job's task and check its strategy options against the model's structure.

    Cheap: the model is built on the ``meta`` device (no memory, no weights). Run it before
    starting processes or writing files, so bad input fails first.

    Raises:
        ConfigError: (``TaskError``, ``StrategyError``) naming the offending field or name.
    """
    if job.strategy.name == "deepspeed":
        _check_deepspeed_job(job)
    task = task if task is not None else build_task(job)
    degree = job.strategy.tensor_parallel
    if job.strategy.block_classes or degree > 1:
        with meta_device():  # only the module structure is needed
            model = task.build_model()
        if job.strategy.block_classes:
            find_blocks(model, job.strategy.block_classes)
        plan = resolve_plan(model, job.strategy) if degree > 1 else None
        if isinstance(plan, dict):  # a plan as code is checked when it runs
            check_plan(model, plan, degree)
    return task


def _check_deepspeed_job(job: JobConfig) -> None:
    """The DeepSpeed config leaves the LR to the Trainer, and the deepspeed extra is installed.

    The file is checked first: its mistakes are the user's to fix whether or not the extra
    is installed on this machine.
    """
    import importlib.util

    from gpu_training.config import read_config_file

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
