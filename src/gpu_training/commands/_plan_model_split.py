"""What a tensor-parallel plan splits of a measured model, for ``gpu-training plan``.

A task, a job file or a ``--hf-config`` model is built on ``meta``; its plan is the job
file's ``strategy.tp_plan``, else the one the model ships (a Hugging Face model's
``base_model_tp_plan``, the built-in model's ``tp_plan``), exactly as ``train`` resolves it
(:func:`gpu_training.strategy.tensor_parallel.resolve_plan`). :func:`model_split` says which
degrees the plan can take (:func:`~gpu_training.strategy.tensor_parallel.check_plan`: widths
and heads) and how many parameters it splits: the others stay whole on every GPU of a
tensor-parallel group, sharded by FSDP over the data-parallel groups only. Private to
:mod:`gpu_training.commands`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from gpu_training.job import JobConfig

__all__ = ["ModelSplit", "model_split"]


@dataclass(frozen=True)
class ModelSplit:
    """A measured model's tensor-parallel plan, or why it has none."""

    model: nn.Module | None
    """The model on ``meta`` (None when it has no plan)."""
    plan: dict[str, str] | None
    """Module-name patterns -> styles; None for a plan as code or no plan."""
    split_params: int | None
    """Parameters the plan splits (None: a plan as code, not known before it runs)."""
    num_params: int
    missing: str = ""
    """Why there is no plan (one line), empty when there is one."""

    @property
    def share(self) -> float:
        """The share of the parameters the plan splits (1.0 when not known)."""
        if self.split_params is None or not self.num_params:
            return 1.0
        return self.split_params / self.num_params

    def refusal(self, degree: int) -> str | None:
        """Why ``degree`` ranks cannot split the model by its plan (None: they can)."""
        from gpu_training.strategy.spec import StrategyError
        from gpu_training.strategy.tensor_parallel import check_plan

        if self.missing:
            return self.missing
        if self.plan is None or self.model is None:
            return None  # a plan as code is checked when it runs
        try:
            check_plan(self.model, self.plan, degree)
        except StrategyError as err:
            return str(err)
        return None


def _distinct(params: Any) -> dict[int, int]:
    return {id(p): p.numel() for p in params}  # tied weights count once


def model_split(model: nn.Module, job: JobConfig | None) -> ModelSplit:
    """The plan ``train`` would apply to ``model`` (built on ``meta``) and what it splits."""
    from gpu_training.strategy.spec import StrategyConfig, StrategyError
    from gpu_training.strategy.tensor_parallel import check_plan, resolve_plan

    total = sum(_distinct(model.parameters()).values())
    spec = job.strategy if job is not None else StrategyConfig()
    try:
        plan = resolve_plan(model, spec)
    except StrategyError as err:
        return ModelSplit(None, None, None, total, missing=str(err))
    if callable(plan):
        return ModelSplit(model, None, None, total)
    try:
        chosen = check_plan(model, plan, 1)
    except StrategyError as err:
        return ModelSplit(None, None, None, total, missing=str(err))
    split: dict[int, int] = {}
    for name, style in chosen.items():
        if style != "sequence_parallel":  # a norm's weights stay whole on every rank
            split.update(_distinct(model.get_submodule(name).parameters()))
    return ModelSplit(model, plan, sum(split.values()), total)
