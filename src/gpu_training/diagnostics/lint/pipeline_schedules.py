"""Pipeline-parallel schedules (``torch.distributed.pipelining``): their ``step()`` is not an
LR scheduler's (``GT014``).

``schedule = ScheduleGPipe(stage, n_microbatches=4)`` runs one pipeline step, forward and
backward over the micro-batches, on its rank's stage; the first stage hands it the inputs
(``if rank == 0: schedule.step(x) else: schedule.step()``), every other rank calls it too.
That rank test is the pipeline's design, not a learning rate one rank changes.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = "from torch.distributed.pipelining import ScheduleGPipe\\ns = ScheduleGPipe(st, 4)\\n"
    >>> facts = ModuleFacts(ast.parse(src + "s.step()\\n"))
    >>> is_pipeline_schedule(facts.tree.body[-1].value.func.value, facts)
    True
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import tail
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name, dotted

__all__ = ["is_pipeline_schedule"]

_PIPELINING = "torch.distributed.pipelining"


def is_pipeline_schedule(receiver: ast.expr, facts: ModuleFacts) -> bool:
    """The receiver (``schedule``, ``self.schedule``) is bound in the file to a schedule of
    ``torch.distributed.pipelining`` (``ScheduleGPipe(...)``, ``Schedule1F1B(...)``…)."""
    name = dotted(receiver)
    if name is None:
        return False
    values = [*facts.instance_values(receiver), *facts.instance_values(ast.Name(tail(name)))]
    for value in values:
        made = call_name(value, facts.imports) or ""
        if made.startswith(_PIPELINING) and tail(made).startswith("Schedule"):
            return True
    return False
