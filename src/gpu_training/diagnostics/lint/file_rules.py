"""The whole-file rules of ``gpu-training lint``, run once the walk of a file is done.

:class:`~gpu_training.diagnostics.lint.checks.FileChecker` walks the statements and hands
each call to the per-call rules; what needs the whole file (or what the walk collected from
it) is decided here: ``GT002`` (a group created with no ``set_device`` anywhere), ``GT005``
(epoch loops without ``set_epoch``), ``GT009`` (collectives left unpaired under a rank
guard), ``GT011`` (a scaler that only meets bf16), ``GT019`` (bf16 parameters under Adam),
``GT020`` (a loss computed past the DDP wrapper) and
``GT015`` (no ``destroy_process_group``, through
:mod:`~gpu_training.diagnostics.lint.teardown`).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.checks import FileChecker
    >>> from gpu_training.diagnostics.lint.project import Project
    >>> project = Project()
    >>> src = "import torch\\ntorch.cuda.amp.GradScaler()\\ntorch.autocast('cuda', torch.bfloat16)\\n"
    >>> checker = FileChecker(project.add("t.py", ast.parse(src)), project)
    >>> checker.settle()
    >>> [(f.code, f.line) for f in checker.report()]
    [('GT011', 2)]
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from gpu_training.diagnostics.lint.bf16_switches import scalers_enabled_by_bf16
from gpu_training.diagnostics.lint.calls import keyword_arg, node_start, parents, tail
from gpu_training.diagnostics.lint.early_devices import cuda_before_pinning
from gpu_training.diagnostics.lint.epoch_paths import constant_epochs, reseeded_on_one_path
from gpu_training.diagnostics.lint.epochs import loops_without_set_epoch, prepared_by_accelerate
from gpu_training.diagnostics.lint.fixed_devices import fixed_ddp_devices
from gpu_training.diagnostics.lint.forward_bypass import bypassed_forwards
from gpu_training.diagnostics.lint.handed_optimizers import (
    handed_to_training,
    returned_to_training,
)
from gpu_training.diagnostics.lint.helper_devices import helper_default_cuda
from gpu_training.diagnostics.lint.hf_launch import saves_on_each_node
from gpu_training.diagnostics.lint.local_branches import locally_decided_collectives
from gpu_training.diagnostics.lint.model import call_name
from gpu_training.diagnostics.lint.paired_collectives import unpaired_collectives
from gpu_training.diagnostics.lint.precision import bf16_adam, scalers_with_bf16
from gpu_training.diagnostics.lint.reiterated_loaders import reiterated_loaders
from gpu_training.diagnostics.lint.setup import global_rank_source
from gpu_training.diagnostics.lint.single_node import loopback_rendezvous
from gpu_training.diagnostics.lint.teardown import creates_plain_group, missing_destroy
from gpu_training.diagnostics.lint.trainer_precision import bf16_trainers
from gpu_training.diagnostics.lint.unprepared_loaders import (
    unprepared_loaders,
    unsplit_iterable_loaders,
)
from gpu_training.diagnostics.lint.visible_devices import (
    cuda_fstring_indices,
    global_visible_devices,
)

if TYPE_CHECKING:
    from gpu_training.diagnostics.lint.checks import FileChecker

__all__ = ["whole_file_rules"]

_GROUP_INITS = ("init_process_group", "init_distributed")


def whole_file_rules(checker: FileChecker) -> None:
    """Report the whole-file rules of a walked file through ``checker.add``.

    Args:
        checker: The file's checker, after its reporting walk (its epoch loops and guarded
            collectives are collected by that walk).
    """
    facts, imports, all_calls = checker.facts, checker.imports, checker.all_calls
    summaries = checker.callee_summaries
    framed = checker.framework in ("accelerate", "fabric")
    inits = [c for c in all_calls if tail(call_name(c, imports)) in _GROUP_INITS]
    direct = [c for c in all_calls if creates_plain_group(c, facts)]
    pinned = (
        bool(checker.tails & {"set_device", "set_device_index", "init_distributed"})
        or any(keyword_arg(c, "device_id") is not None for c in direct)
        or any(s.sets_device for s in summaries)
    )
    default_cuda = [(n, w) for n, w in checker.setup.default_cuda if not _groupless(checker, n)]
    if direct and not pinned and default_cuda:
        node, what = default_cuda[0]
        checker.add(node, "GT002", f"{what} without set_device")
    elif direct and not pinned and (helper := helper_default_cuda(facts)):
        site = min(direct, key=lambda c: (c not in inits, c.lineno))  # the group's own call
        checker.add(site, "GT002", f"no set_device, and {helper}")
    streams = (
        unsplit_iterable_loaders(facts)
        if checker.framework == "fabric" or (checker.distributed and checker.framework is None)
        else []
    )
    reported = {(f.line, f.col) for f in checker.findings if f.code == "GT003"}
    for loader, detail in [*(unprepared_loaders(facts) if framed else []), *streams]:
        # `if world_size > 1: raise` before it; or the ordinary check's finding there already
        if id(loader) not in checker.setup.alone and node_start(loader) not in reported:
            checker.add(loader, "GT003", detail)
    for call in cuda_before_pinning(facts):
        checker.add(call, "GT002", "the current GPU before the library pins it")
    for index, detail in fixed_ddp_devices(facts, all_calls) if checker.distributed else []:
        checker.add(index, "GT002", detail)
    tails = checker.tails
    if "train_one_epoch" in facts.functions or any(
        facts.callees(c) for c in all_calls if tail(call_name(c, imports)) == "train_one_epoch"
    ):
        tails = tails - {"train_one_epoch"}  # the script's own, not the toolkit's
    if prepared_by_accelerate(facts, all_calls):
        tails = tails | {"set_epoch"}  # Accelerate's prepared loader reseeds its sampler
    # a file with no process group in sight (a UI whose distributed option is never set up)
    loops = checker.epoch_loops if checker.distributed else []
    for loop in loops_without_set_epoch(
        loops, all_calls, tails, facts, imported=checker.unset_sampler
    ):
        checker.add(loop, "GT005", "the sampler shuffles and set_epoch() is never called")
    for call in constant_epochs(facts) if checker.distributed else []:
        checker.add(call, "GT005", "set_epoch() gets the same value every epoch")
    for call in reiterated_loaders(facts) if checker.distributed else []:
        checker.add(call, "GT005", "the loader is re-iterated and set_epoch() never advances")
    for loop in reseeded_on_one_path(facts):
        checker.add(loop, "GT005", "set_epoch() only on one of the sampler's paths")
    for index, _, evidence in global_visible_devices(facts) if checker.distributed else []:
        checker.add(index, "GT018", f"CUDA_VISIBLE_DEVICES from the global rank: {evidence}")
    for index, fstring in cuda_fstring_indices(facts) if checker.distributed else []:
        where = facts.scope_containing(fstring)  # the same evidence as the per-call check's
        found = global_rank_source(facts, index, where) or checker.setup.equal_to_rank(index, where)
        if found is not None:
            checker.add(index, "GT018", found)
    for arguments in saves_on_each_node(facts):
        checker.add(arguments, "GT017", "save_on_each_node=True: the Trainer saves on every node")
    for scaler in scalers_with_bf16(all_calls, facts):
        checker.add(scaler, "GT011", "every autocast it meets is bfloat16")
    for scaler, detail in scalers_enabled_by_bf16(all_calls, facts):  # enabled=(dtype == "bf16")
        checker.add(scaler, "GT011", detail)
    for optimizer, detail in bf16_adam(facts) if checker.distributed else []:  # a launched run
        if (
            checker.trains
            or handed_to_training(facts, optimizer)  # `Trainer(m, opt).step()`
            or returned_to_training(facts, optimizer)  # `opt = get_optimizer(m)`, then steps
        ):
            checker.add(optimizer, "GT019", detail)
    for trainer, detail in bf16_trainers(facts):  # the Hugging Face Trainer's own AdamW
        checker.add(trainer, "GT019", detail)
    if checker.distributed:  # a loss computed past the DDP wrapper: never all-reduced
        prepared = checker.framework == "accelerate" and checker.ddp_wrapper
        fabric = checker.framework == "fabric"
        for node, detail in bypassed_forwards(facts, prepared=prepared, fabric=fabric):
            checker.add(node, "GT020", detail)
    for guarded in unpaired_collectives(checker.guarded_collectives):
        checker.add(guarded.call, "GT009", guarded.collective)
    ranked = {id(g.call) for g in checker.guarded_collectives}
    for call, detail in locally_decided_collectives(facts, checker.ranks.collective):
        if checker.distributed and id(call) not in ranked:  # `if psnr > best:` on a shard
            checker.add(call, "GT009", detail)
    missing = missing_destroy(
        facts,
        inits,
        trains=checker.trains,
        summaries=summaries,
        ranks=checker.ranks,
        helper_module=bool(checker.external_sites),
    )
    if missing is not None:
        checker.add(missing[0], "GT015", missing[1])
    if loopback_rendezvous(facts):  # one machine's group: its global rank is the GPU's index
        checker.findings = {f for f in checker.findings if f.code != "GT018"}


def _groupless(checker: FileChecker, node: ast.AST) -> bool:
    """``node`` is on the side of a switch where the file creates no process group: the
    ``else:`` of ``if use_distributed: setup(); device = f"cuda:{local_rank}"`` (its
    ``"cuda"`` is the one process's GPU)."""
    up = parents(checker.facts)
    child, parent = node, up.get(id(node))
    while parent is not None:
        if (
            isinstance(parent, ast.If)
            and any(child is s for s in parent.orelse)
            and checker.ranks.creates_group(parent.body)
        ):
            return True
        child, parent = parent, up.get(id(parent))
    return False
