"""Run :func:`~gpu_training.diagnostics.verify.report.verify_setup` on N ranks from one call.

:func:`run_verify` (what ``gpu-training verify`` calls) resolves the setup — a built-in task,
import strings for the model, data and loss, or a job file — in this process first, so a typo
fails before any process starts, then starts ``torchrun`` with this module as the workers'
entry point (``python -m gpu_training.diagnostics.verify.launch SPEC RESULT``). Rank 0 writes
the report as JSON; the caller reads it back.

Example:
    >>> spec = _Spec(task="charlm", options={"n_layer": 1})
    >>> task, sampler, step = _resolve(spec)
    >>> task.name, sampler, step
    ('charlm', None, None)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from gpu_training.ddp import DistributedContext
from gpu_training.diagnostics.verify.plan import AccumulateFn
from gpu_training.diagnostics.verify.report import (
    SamplerFn,
    VerifyInputError,
    VerifyReport,
    verify_setup,
)

__all__ = ["run_verify"]


@dataclass
class _Spec:
    """What a verify worker builds (JSON between the launcher and the ranks)."""

    task: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    data: str | None = None
    loss: str | None = None
    config: str | None = None
    overrides: list[str] = field(default_factory=list)
    sampler: str = "global"
    step: str | None = None
    batch_size: int = 4
    accum: int = 2
    rtol: float = 1e-4
    atol: float = 1e-6
    seed: int = 0
    backend: str | None = None


def _resolve(spec: _Spec) -> tuple[Any, SamplerFn | None, AccumulateFn | None]:
    """The task, sampler factory and accumulation function a spec names (TaskError if not)."""
    from gpu_training.tasks import TaskError, resolve_import, resolve_task, task_from_imports

    if spec.config is not None:
        from gpu_training.job import load_job
        from gpu_training.tasks import build_task

        task = build_task(load_job(spec.config, list(spec.overrides)))
    elif spec.model is not None or spec.data is not None:
        if spec.model is None or spec.data is None:
            raise TaskError("--model and --data go together: give both import strings")
        task = task_from_imports(spec.model, spec.data, spec.loss)
    else:
        task = resolve_task(spec.task or "charlm", spec.options)
    make_sampler: SamplerFn | None = None
    if spec.sampler == "distributed":
        from gpu_training.ddp import make_distributed_sampler

        def make_sampler(data: Dataset[Any], ctx: DistributedContext) -> Any:
            return make_distributed_sampler(data, ctx, shuffle=True, seed=spec.seed)

    elif spec.sampler != "global":
        if ":" not in spec.sampler:
            raise TaskError(
                f"--sampler: expected 'global', 'distributed' or an import string "
                f"'package.module:function', got {spec.sampler!r}"
            )
        make_sampler = resolve_import(spec.sampler)
    accumulate = resolve_import(spec.step) if spec.step else None
    return task, make_sampler, accumulate


def _tp_strategy(spec: _Spec) -> Any:
    """The job file's strategy when it runs tensor parallel (``tensor_parallel`` > 1), else None."""
    if spec.config is None:
        return None
    from gpu_training.job import load_job

    strategy = load_job(spec.config, list(spec.overrides)).strategy
    return strategy if strategy.tensor_parallel > 1 else None


def _tp_checks(task: Any, train: Any, ctx: DistributedContext, spec: _Spec) -> list[Any]:
    """The tensor-parallel checks of a job whose strategy has ``tensor_parallel`` > 1."""
    strategy = _tp_strategy(spec)
    if strategy is None:
        return []
    from gpu_training.diagnostics.verify.plan import VerifyPlan
    from gpu_training.diagnostics.verify.tp_checks import check_tensor_parallel
    from gpu_training.process_group import collective_device
    from gpu_training.tasks import count_scored

    plan = VerifyPlan(
        train,
        task.loss_sum or task.loss_fn,
        ctx,
        collective_device(),
        spec.batch_size,
        1,  # one micro-batch per data-parallel replica
        spec.rtol,
        spec.atol,
        spec.seed,
        count_fn=task.count_targets or count_scored,
    )
    return check_tensor_parallel(task.build_model, plan, strategy)


def _worker(spec_json: str, result_path: str) -> None:
    """One rank of :func:`run_verify` (``python -m gpu_training.diagnostics.verify.launch``)."""
    from gpu_training.ddp import cleanup_distributed, init_distributed
    from gpu_training.strategy.spec import StrategyError

    spec = _Spec(**json.loads(spec_json))
    ctx = init_distributed(backend=spec.backend)
    try:
        task, make_sampler, accumulate = _resolve(spec)
        train, _ = task.build_data()
        try:
            report = verify_setup(
                task.build_model,
                train,
                task.loss_sum or task.loss_fn,  # what the Trainer trains with
                ctx,
                count_fn=task.count_targets,
                batch_size=spec.batch_size,
                accum_steps=spec.accum,
                make_sampler=make_sampler,
                accumulate=accumulate,
                rtol=spec.rtol,
                atol=spec.atol,
                seed=spec.seed,
            )
            report.checks.extend(_tp_checks(task, train, ctx, spec))
            report.setup = f"task {task.name}: {report.setup}"
            payload: dict[str, Any] = report.to_dict()
        except (VerifyInputError, StrategyError) as err:  # a TP plan that does not apply too
            payload = {"error": str(err)}
        if ctx.is_main_process:
            tmp = Path(result_path + ".tmp")
            tmp.write_text(json.dumps(payload))
            os.replace(tmp, result_path)
    finally:
        cleanup_distributed()


def run_verify(
    *,
    nproc: int = 2,
    task: str | None = None,
    options: Mapping[str, Any] | None = None,
    model: str | None = None,
    data: str | None = None,
    loss: str | None = None,
    config: str | None = None,
    overrides: Iterable[str] = (),
    sampler: str = "global",
    step: str | None = None,
    batch_size: int = 4,
    accum: int = 2,
    rtol: float = 1e-4,
    atol: float = 1e-6,
    seed: int = 0,
    backend: str | None = None,
    timeout: float | None = None,
) -> VerifyReport:
    """Start ``torchrun`` with ``nproc`` ranks, run :func:`verify_setup` on the named setup.

    The model, data and loss come from a built-in task (``task``, default ``charlm``), from
    import strings (``model``/``data``/``loss``, as in a job file) or from a job file
    (``config`` with ``overrides``). Everything named is resolved here first, so a typo fails
    before any process starts.

    Args:
        nproc: Ranks to start on this machine.
        task: Built-in task name or ``pkg.mod:factory`` returning a Task.
        options: The task's options.
        model: ``pkg.mod:fn`` returning the model.
        data: ``pkg.mod:fn`` returning ``(train, val)`` datasets.
        loss: ``pkg.mod:fn`` loss (default cross-entropy).
        config: A job file (its ``task`` section is used).
        overrides: ``KEY=VALUE`` overrides of the job file.
        sampler: ``"global"`` (the Trainer's), ``"distributed"`` (DistributedSampler) or an
            import string ``fn(dataset, ctx) -> sampler``.
        step: Import string of ``fn(model, micro_batches, loss_fn)``: your accumulation loop.
        batch_size: Per-device micro-batch.
        accum: Micro-batches per step in the accumulation check.
        rtol: Relative gradient tolerance.
        atol: Absolute tolerance.
        seed: Seed.
        backend: ``"gloo"``, ``"nccl"`` or None (NCCL with GPUs, else gloo).
        timeout: Seconds before the ranks are killed (None: no limit).

    A job file whose strategy has ``tensor_parallel`` > 1 adds the checks of
    :mod:`~gpu_training.diagnostics.verify.tp_checks` to the report.

    Returns:
        The report (also when checks fail).

    Raises:
        ConfigError: (``TaskError``, ``VerifyInputError``, ``StrategyError``) on bad input,
            before or from the ranks (a job's ``tensor_parallel`` not dividing ``nproc``
            before they start).
        RuntimeError: If the ranks failed (their output went to stderr) or timed out.
    """
    import subprocess

    from gpu_training.launcher import launch_env

    spec = _Spec(
        task=task,
        options=dict(options or {}),
        model=model,
        data=data,
        loss=loss,
        config=config,
        overrides=list(overrides),
        sampler=sampler,
        step=step,
        batch_size=batch_size,
        accum=accum,
        rtol=rtol,
        atol=atol,
        seed=seed,
        backend=backend,
    )
    _resolve(spec)  # bad input fails here, in one line, before any process starts
    strategy = _tp_strategy(spec)
    if strategy is not None:
        from gpu_training.strategy.tensor_parallel import check_degree

        check_degree(nproc, strategy.tensor_parallel)  # the strategy's own one-line refusal
    with tempfile.TemporaryDirectory(prefix="gpu-training-verify-") as tmp:
        result = Path(tmp) / "report.json"
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            f"--log-dir={Path(tmp) / 'torchrun'}",  # else torchrun leaves /tmp/torchelastic_*
            "-m",
            "gpu_training.diagnostics.verify.launch",
            json.dumps(asdict(spec)),
            str(result),
        ]
        env = launch_env(os.environ, nproc_per_node=nproc, restarts=False)
        try:
            proc = subprocess.run(argv, env=env, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"verify: the {nproc} ranks did not finish in {timeout}s") from None
        if not result.exists():
            raise RuntimeError(
                f"verify: the ranks failed (exit code {proc.returncode}); see their output above"
            )
        payload = json.loads(result.read_text())
    if "error" in payload:
        raise VerifyInputError(payload["error"])
    return VerifyReport.from_dict(payload)


def _main(argv: Sequence[str]) -> None:
    from gpu_training.watchdog import entry_point

    if len(argv) != 2:
        raise SystemExit("usage: python -m gpu_training.diagnostics.verify.launch SPEC RESULT")
    entry_point(_worker)(argv[0], argv[1])


if __name__ == "__main__":
    _main(sys.argv[1:])
