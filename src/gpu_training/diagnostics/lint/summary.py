"""What a function of the project does, and how a module asks: the interface between a
module's facts (:mod:`~gpu_training.diagnostics.lint.model`) and its project
(:mod:`~gpu_training.diagnostics.lint.project`).

Data only: :class:`Summary` is filled by the project, :class:`Resolver` is the project as a
module sees it.

Example:
    >>> Summary(where="is_main() (utils.py:3)", rank0=True).rank0
    True
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpu_training.diagnostics.lint.model import ModuleFacts, Scope

__all__ = ["FuncRef", "Resolver", "Summary"]

_Func = ast.FunctionDef | ast.AsyncFunctionDef
FuncRef = tuple["ModuleFacts", _Func]
"""A function and the module it is defined in."""


@dataclass(frozen=True)
class Summary:
    """What a function does, as far as the project's own code shows.

    Computed by :mod:`~gpu_training.diagnostics.lint.project`, through the functions it calls
    (in its file or in another module of the project).

    Attributes:
        where: ``name() (file:line)``, for the evidence of a finding.
        rank0: It returns a test true on rank 0 only (``return get_rank() == 0``).
        local: That test reads the node-local rank (``return args.local_rank == 0``).
        single: It returns a test true only without a process group (``return rank == -1``).
        rank_value: It returns a rank: ``"global"`` (``dist.get_rank()``), ``"local"``.
        rank_items: The positions of the tuple it returns that hold a rank, with which one
            (``return True, dist.get_rank(), world`` → ``((1, "global"),)``).
        silences_print: It replaces ``builtins.print`` (or ``sys.stdout``), as DeiT's
            ``setup_for_distributed(is_master)`` does on the ranks other than 0.
        rank_logging: It chooses log handlers or levels by rank (Swin's ``create_logger``).
        creates_group: Where it creates the process group (``init_process_group (x.py:9)``).
        destroys_group: It destroys the process group.
        sets_device: It calls ``torch.cuda.set_device``.
        collective: The collective it runs, as reported (``all_reduce (x.py:12)``).
        saves_argument: The position of the argument it hands to ``torch.save`` (``def
            save_checkpoint(state, filename): torch.save(state, filename)`` → 0), if any.
        saves_state_of: The positions of the parameters whose ``state_dict()`` it hands to
            ``torch.save`` (``def save_model(net, path): torch.save({"model":
            net.state_dict()}, path)`` → ``(0,)``).
        unsharded_loader: It returns a ``DataLoader`` it builds with no sampler (and builds
            no distributed sampler).
        shuffles_sampler: It builds a shuffling distributed sampler.
        sets_epoch: It calls ``set_epoch`` (or the toolkit's ``train_one_epoch``).
        trains: It runs a training step (``backward()``, ``zero_grad()``, ``optimizer.step()``).
        distributed: It uses ``torch.distributed`` or sets up distributed training.
        spawns: It starts the ranks (``mp.spawn(worker, ...)``, itself or through a function
            it calls): the process that calls it is the launcher, not a rank.
        returns: The kinds of what it returns (``dist_sampler``, ``rank_logger``…).
    """

    where: str = ""
    rank0: bool = False
    local: bool = False
    single: bool = False
    rank_value: str | None = None
    rank_items: tuple[tuple[int, str], ...] = ()
    silences_print: bool = False
    rank_logging: bool = False
    creates_group: str | None = None
    destroys_group: bool = False
    sets_device: bool = False
    collective: str | None = None
    trains: bool = False
    saves_argument: int | None = None
    saves_state_of: tuple[int, ...] = ()
    unsharded_loader: bool = False
    shuffles_sampler: bool = False
    sets_epoch: bool = False
    distributed: bool = False
    spawns: bool = False
    returns: frozenset[str] = frozenset()


class Resolver(Protocol):
    """How a module sees the rest of its project (:class:`~gpu_training.diagnostics.lint.project.Project`)."""

    shipped_only: bool
    """Judge the runs the repository ships (its run scripts, README, flags they pass), not
    every launch a user could choose (off: ``gpu-training lint --unshipped``)."""

    def callees(self, facts: ModuleFacts, func: ast.expr) -> list[FuncRef]:
        """The functions (of this file or of the project) a callee expression may name."""
        ...

    def summary(self, ref: FuncRef) -> Summary:
        """What a function does."""
        ...

    def attribute_values(self, attr: str) -> list[tuple[ModuleFacts, Scope, ast.expr]]:
        """Every value assigned to ``<anything>.attr`` in the project's parsed modules."""
        ...

    def incoming(self, ref: FuncRef) -> list[tuple[ModuleFacts, ast.Call, Scope]]:
        """The calls of a function from the project's other linted files."""
        ...

    def runs_distributed(self, facts: ModuleFacts) -> bool:
        """Whether a file of the project runs under a process group."""
        ...

    def star_callees(self, facts: ModuleFacts, name: str) -> list[FuncRef]:
        """What a bare ``name(...)`` runs when a ``from module import *`` brings it."""
        ...

    def module_facts(self, facts: ModuleFacts, module: str, level: int) -> ModuleFacts | None:
        """The facts of the project module ``facts`` imports as ``module``, or None."""
        ...
