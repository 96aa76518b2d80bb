"""The catalogue of ``gpu-training lint`` rules: one per classic distributed-training pitfall.

Data only (no torch, no AST work): each :class:`Rule` has a code ``GT001``…, a one-line
message, a longer explanation that quotes the reasoning of the guides the toolkit is built on,
and a fix. :mod:`gpu_training.diagnostics.lint.checks` finds the pitfalls;
:mod:`gpu_training.diagnostics.lint` runs the checks and prints them.

Two severities: ``bug`` rules find a mistake that costs a run (wrong data, a hang, a corrupt
file, wasted compute); ``hygiene`` rules (:data:`HYGIENE`: printing from every rank, a
learning rate that is not scaled) find code a careful user may keep on purpose, so
``gpu-training lint`` leaves them out unless asked (``--hygiene`` or ``--select GT008``).

Example:
    >>> RULES["GT007"].name
    'unguarded-write'
    >>> RULES["GT008"].severity
    'hygiene'
    >>> print(explain("GT004").splitlines()[0])
    GT004 shuffle-with-sampler: shuffle=True passed to a DataLoader that also has a sampler
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, replace

__all__ = ["BUG", "GUIDES", "HYGIENE", "RULES", "Rule", "explain"]

BUG = "bug"
"""The default severity: a mistake that costs a run."""
HYGIENE = "hygiene"
"""Off by default: code worth a look, often kept on purpose."""

GUIDES: dict[str, str] = {
    "dist": "Distributed Training Guide (gpu_training)",
    "amp": "Mixed-Precision Training (gpu_training)",
    "tutorial": "PyTorch Distributed Training Tutorial",
    "strategies": "Distributed Training Guide: strategies and memory",
    "patterns": "Distributed Training: patterns and synchronisation",
    "multigpu": "PyTorch Distributed Training: Multi-GPU Guide 2025",
}
"""The guides the explanations cite (the project's specification, shared/seeds/*.txt)."""


@dataclass(frozen=True)
class Rule:
    """One lint rule.

    Attributes:
        code: ``GT`` and three digits.
        name: A short kebab-case name.
        message: The one line printed with each finding.
        explanation: Why it is a bug, in a few sentences.
        fix: What to write instead.
        cites: ``(guide key, section)`` pairs from :data:`GUIDES` backing the explanation.
        severity: :data:`BUG` (reported by default) or :data:`HYGIENE` (on request).
    """

    code: str
    name: str
    message: str
    explanation: str
    fix: str
    cites: tuple[tuple[str, str], ...]
    severity: str = BUG


def _rule(
    code: str, name: str, message: str, explanation: str, fix: str, *cites: tuple[str, str]
) -> Rule:
    return Rule(code, name, message, " ".join(explanation.split()), " ".join(fix.split()), cites)


def _hygiene(rule: Rule) -> Rule:
    return replace(rule, severity=HYGIENE)


_RULE_LIST = [
    _rule(
        "GT001",
        "data-parallel",
        "torch.nn.DataParallel: use DistributedDataParallel (one process per GPU)",
        """DataParallel runs one process with one thread per GPU: the GIL and the scatter/gather
        of every batch through one "master" GPU make it slow and memory-lopsided, and it does
        not scale beyond one node. "It is effectively deprecated. Do not use it for new work."
        DDP runs one process per GPU, all-reduces gradients overlapped with backward and is
        typically 2-3x faster at 4 GPUs.""",
        """Launch with torchrun, call gpu_training.ddp.init_distributed() and wrap the model in
        torch.nn.parallel.DistributedDataParallel (gpu_training.strategy.wrap_model(model,
        "ddp", ctx)).""",
        ("dist", "Why DDP (and not DataParallel)"),
        ("tutorial", "Why DDP Instead of DataParallel"),
    ),
    _rule(
        "GT002",
        "no-set-device",
        "process group without torch.cuda.set_device(local_rank): every rank lands on cuda:0",
        """The script creates a process group and puts work on the *current* CUDA device
        (".cuda()", "cuda", or a fixed "cuda:0") but never pins the process to its own GPU.
        "Skipping that step is the classic first bug: every rank lands on cuda:0, you run out
        of memory, and ranks 1..N sit idle." A hard-coded "cuda:0" (or DDP's device_ids=[0] /
        output_device=0) does the same even after set_device.""",
        """Call torch.cuda.set_device(local_rank) before init_process_group (or use
        gpu_training.ddp.init_distributed(), which does it) and use
        gpu_training.ddp.resolve_device(ctx) instead of a literal device.""",
        ("dist", "The process group mental model"),
        ("multigpu", "DDP Training Script"),
    ),
    _rule(
        "GT003",
        "no-distributed-sampler",
        "DataLoader in a distributed script without a DistributedSampler: every rank sees the "
        "same data",
        """Each rank must see a different slice of the dataset, "or you are just training the
        same batch N times": without a DistributedSampler "every GPU processes the same data,
        N x wasted compute, wrong gradients". A RandomSampler or SequentialSampler is not
        distributed either. (Loaders whose name says validation/evaluation/test are not
        checked, nor loaders handed to accelerator.prepare(), built with **kwargs, or over a
        dataset that takes the rank; a sampler chosen in an if/else or built by a helper of
        the project counts when any path gives a distributed one. A loader whose every use
        is a loop with no backward or optimizer step - evaluation where every rank must see
        the same batches - is not reported; nor one built on the single-process side of a
        switch whose other side builds it with a DistributedSampler. In an Accelerate or Fabric
        script, a training loader that never reaches prepare()/setup_dataloaders() itself -
        not only a generator wrapping it - is reported, and so is a loader over an
        IterableDataset of the project that never splits itself by rank, in a Fabric script
        or one with no framework; Accelerate's prepare() dispatches its batches.)""",
        """sampler = gpu_training.ddp.make_distributed_sampler(dataset, ctx, shuffle=True,
        seed=...) and DataLoader(dataset, batch_size=..., sampler=sampler, shuffle=(sampler is
        None)); or a gpu_training.data.GlobalBatchSampler as batch_sampler.""",
        ("dist", "Sharding data correctly"),
        ("strategies", "Common Pitfalls"),
    ),
    _rule(
        "GT004",
        "shuffle-with-sampler",
        "shuffle=True passed to a DataLoader that also has a sampler",
        """"Do not also pass shuffle=True to the DataLoader when a sampler is set - PyTorch
        forbids it": the DataLoader raises "sampler option is mutually exclusive with
        shuffle". The sampler does the shuffling (DistributedSampler(shuffle=True) with
        set_epoch).""",
        """Pass shuffle=(sampler is None) - the idiom that works whether
        make_distributed_sampler returned a sampler or None - or drop shuffle.""",
        ("dist", "Sharding data correctly"),
    ),
    _rule(
        "GT005",
        "no-set-epoch",
        "epoch loop over a DistributedSampler's loader never calls sampler.set_epoch(epoch)",
        """"Call sampler.set_epoch(epoch) every epoch. Without it the sampler uses the same
        shuffle seed each epoch and every rank sees the same order forever." The tutorial
        lists it with LR scaling as "the two details most often missed by practitioners new
        to DDP".""",
        """Call sampler.set_epoch(epoch) at the top of every epoch (on every rank), or use
        gpu_training.ddp.train_one_epoch(), which does it.""",
        ("dist", "Sharding data correctly"),
        ("tutorial", "Common DDP Pitfalls"),
    ),
    _rule(
        "GT006",
        "ddp-state-dict",
        "saving the DDP wrapper's state_dict(): keys get a 'module.' prefix",
        """"torch.save(model.state_dict()) saves DDP-prefixed keys": every key starts with
        "module.", and the checkpoint does not load into a plain (non-DDP) model for inference
        or into a run on another strategy. The DeepSpeed engine deepspeed.initialize returns
        and the model an Accelerator's prepare() returns are such wrappers too. Pickling the
        wrapper itself (torch.save(model)) is worse: it needs the process group to load.""",
        """Save gpu_training.ddp.unwrap_model(model).state_dict() (or model.module.state_dict()),
        or let gpu_training.checkpoint.CheckpointManager.save() strip the prefixes.""",
        ("dist", "Checkpointing without corrupting files"),
        ("tutorial", "Common DDP Pitfalls"),
    ),
    _rule(
        "GT007",
        "unguarded-write",
        "every rank writes this file: guard it with a rank-0 check",
        """"All ranks hold identical weights, so only rank 0 writes. Having every rank write the
        same path to a shared filesystem at once corrupts the file." A write outside an
        `if rank == 0` / `if ctx.is_main_process` guard runs on every process. (A path that
        contains the rank, i.e. one file per rank - directly or through a name or parameter
        built with it - is not flagged, nor a call told which process is main
        (save_pretrained(..., is_main_process=...)), nor the code of a launcher that starts
        the ranks from the same file. A guard on the node-local rank is GT017.)""",
        """Wrap the write in `if ctx.is_main_process:` (followed by a barrier on every rank if
        others read the file), or use gpu_training.checkpoint.CheckpointManager, which writes
        on rank 0 atomically and makes save() a barrier.""",
        ("dist", "Checkpointing without corrupting files"),
        ("strategies", "Common Pitfalls"),
    ),
    _hygiene(
        _rule(
            "GT008",
            "unguarded-log",
            "printing or logging from every rank: guard it with a rank-0 check",
            """"Guard all printing, progress bars, and metric uploads with ctx.is_main_process to
        avoid eight identical log streams." Each rank's number is also only its own shard's:
        reduce before logging. Hygiene, not a bug: off unless asked. (Not flagged: messages
        that include the rank, error paths in `except` blocks and right before an exit,
        warnings, loggers whose level or handlers are chosen by rank, prints in a project
        whose setup replaces builtins.print on the other ranks (setup_for_distributed), and a
        launcher's own code.)""",
            """metrics = reduce_scalar_dict({...}, ctx) on every rank, then `if
        ctx.is_main_process: print(...)`; give tqdm `disable=not ctx.is_main_process`.""",
            ("dist", "Logging metrics across ranks"),
            ("strategies", "Common Pitfalls"),
            ("tutorial", "Logging and Checkpointing in DDP"),
        )
    ),
    _rule(
        "GT009",
        "rank-guarded-collective",
        "collective inside a rank-dependent branch: the other ranks never reach it (deadlock)",
        """"A barrier that only some ranks reach causes a deadlock; every barrier must be called
        by all ranks." The same holds for every collective (all_reduce, broadcast, gather...)
        and for helpers that run one: CheckpointManager.save() is a barrier, reduce_scalar_dict
        an all-reduce, an FSDP state_dict() an all-gather - and for libraries' calls that are
        collectives under the hood: Accelerate's save_state and wait_for_everyone (and
        load_state under FSDP or DeepSpeed; save_state under a plain DDP config without
        automatic checkpoint naming synchronises nothing), Fabric's save, a DeepSpeed engine's
        save_checkpoint, the forward, generate(), state_dict() or save_pretrained() of an
        FSDP-sharded model, FSDP.summon_full_params (all-gathers of the parameters), and the
        forward of a DDP model whose module has buffers (BatchNorm statistics, a registered
        buffer): with broadcast_buffers=True, the default, DDP broadcasts them from rank 0 at
        the first forward after a training step, so evaluating the wrapped model on rank 0
        after the epoch's training hangs (evaluate model.module, or pass
        broadcast_buffers=False), and the DistributedDataParallel constructor itself, which
        checks the parameters' shapes across the ranks and broadcasts rank 0's (unless given
        a process_group of its own), and the Hugging Face Trainer's save_model when its
        arguments shard the model (a DeepSpeed ZeRO-3 config, fsdp=): it gathers the weights
        on every rank before the main process writes, so "if trainer.is_world_process_zero():
        trainer.save_model()" hangs rank 0 - call it on every rank, it writes once by itself.
        (A helper whose literal argument
        turns its barrier off, torch_distributed_zero_first(-1), is not one there.) Without
        TORCH_DISTRIBUTED_DEBUG=DETAIL the job hangs silently until the 30-minute timeout.""",
        """Call the collective on every rank, outside the `if rank == 0` block; keep only the
        rank-0 work (printing, writing) inside it.""",
        ("tutorial", "Common DDP Pitfalls"),
        ("patterns", "Avoiding Deadlocks"),
        ("tutorial", "Debugging DDP Hangs"),
    ),
    _hygiene(
        _rule(
            "GT010",
            "unscaled-lr",
            "constant learning rate in a data-parallel script: scale it with the effective batch",
            """The optimizer sees per_device_batch x accumulation x world_size samples per step. "If
        you tuned a learning rate at effective batch 256 on one GPU, then run the same
        per_device_batch_size on 8 GPUs, your effective batch silently becomes 2048 - 8x larger
        - and your learning rate is now far too small." A literal LR cannot follow the world
        size. Hygiene, not a bug: off unless asked. (If the value was tuned for this exact
        world size, say so with # noqa: GT010.)""",
            """Derive it: TrainingConfig(learning_rate=..., base_batch_size=...).scaled_learning_rate
        (or gpu_training.config.scale_lr), i.e. base_lr x effective_batch / base_batch, with a
        warmup (linear_warmup_cosine_lr).""",
            ("dist", "Effective batch size: the number that actually matters"),
            ("tutorial", "Scaling the Learning Rate"),
            ("multigpu", "Linear Scaling Rule"),
        )
    ),
    _rule(
        "GT011",
        "grad-scaler-bf16",
        "GradScaler with bfloat16 autocast: bf16 needs no loss scaling",
        """"Loss scaling is only needed for float16. bfloat16 has the same 8-bit exponent as
        float32, so its dynamic range is identical and gradients do not underflow. A bfloat16
        run needs no scaler at all." A scaler there only adds inf/NaN checks, skipped steps and
        state to checkpoint.""",
        """Use gpu_training.amp.MixedPrecisionTrainer(optimizer, precision="bf16"), which
        disables the scaler (needs_grad_scaler("bf16") is False), or
        GradScaler(enabled=(dtype == torch.float16)).""",
        ("amp", "Two ideas people conflate"),
        ("amp", "fp16 vs bf16: which to use"),
    ),
    _rule(
        "GT012",
        "clip-before-unscale",
        "gradient clipping before scaler.unscale_(optimizer): the threshold is 65,536x too large",
        """"If you clip while gradients are still multiplied by the loss-scale factor (often
        2^16), you are clipping against a threshold that is 65,536x too large - i.e. you are
        not clipping at all." The order is unscale_, then clip, then scaler.step.""",
        """scaler.unscale_(optimizer); clip_grad_norm_(params, max_norm); scaler.step(optimizer);
        scaler.update() - or MixedPrecisionTrainer(..., max_grad_norm=...), which does it.""",
        ("amp", "Why unscale-before-clip matters"),
    ),
    _rule(
        "GT013",
        "accumulation-without-no-sync",
        "gradient accumulation on a DDP model without no_sync(): every micro-batch all-reduces",
        """"DDP runs an all-reduce on every backward() by default, so naive accumulation syncs
        gradients you are about to keep accumulating." The result is correct but each
        accumulation window pays accumulation_steps all-reduces instead of one. The same holds
        for accumulation through a helper (loss_scaler(loss, optimizer,
        update_grad=(i + 1) % k == 0)), for a micro-batch loop that calls backward() k times
        before one optimizer step, and for accelerator.backward() without
        accelerator.accumulate() (Accelerate) or fabric.no_backward_sync() (Fabric).""",
        """Wrap the non-stepping micro-batches: `with model.no_sync() if not stepping else
        nullcontext():` or `with gpu_training.ddp.gradient_sync(model, enabled=stepping):`
        (stepping = gpu_training.amp.should_step(micro_step, accum)); with Accelerate, `with
        accelerator.accumulate(model):` and Accelerator(gradient_accumulation_steps=k).""",
        ("dist", "Gradient accumulation under DDP"),
        ("tutorial", "Gradient Synchronisation and Communication"),
    ),
    _rule(
        "GT014",
        "rank-dependent-update",
        "learning rate, optimizer state or weights changed on some ranks only: the replicas diverge",
        """"if rank == 0: adjust_learning_rate(optimizer, epoch) - at next step, rank 0 has
        different lr than others. Divergence in training!" The same holds for a scheduler or
        optimizer step taken under a rank check: DDP keeps gradients in sync, not what each
        rank does with them. And for the weights themselves: DDP broadcasts them once, when it
        wraps the model, so `if is_main: ema.copy_to(model.parameters())` inside the training
        loop (EMA weights put in for a validation and never restored) leaves rank 0 training
        other weights than the rest for the whole run.""",
        """Run schedulers, LR changes and optimizer steps on every rank; if the value comes from
        rank 0, broadcast it first (dist.broadcast_object_list). Put the trained weights back
        after an EMA validation (ema.store(params); ema.copy_to(params); ...;
        ema.restore(params)), or evaluate a copy.""",
        ("patterns", "Common Pitfall: Rank 0 Behaves Differently"),
    ),
    _rule(
        "GT015",
        "no-destroy-process-group",
        "process group created but never destroyed",
        """"Always destroy the process group at the end (and in your exception handler) so
        NCCL releases resources cleanly." Measured here: without a barrier before
        destroy_process_group(), 4 of 6 gloo runs aborted at exit. The group counts wherever
        it is created: a helper of the project (init_distributed_mode(args) in utils.py) that
        creates it makes the training script that calls the helper responsible for
        destroying it.""",
        """try: ... finally: gpu_training.ddp.cleanup_distributed() (barrier, then
        destroy_process_group; idempotent), or dist.destroy_process_group() at the end of
        main.""",
        ("dist", "Tearing down"),
    ),
    _rule(
        "GT016",
        "no-sync-after-forward",
        "no_sync() encloses backward() but not the forward: the gradients are still all-reduced",
        """DDP decides in forward() whether the next backward() all-reduces (it prepares the
        reducer there when gradient sync is on), so a no_sync() block entered after the
        forward changes nothing: every micro-batch still pays an all-reduce. The guides put
        the forward and the backward in the same block: "with model.no_sync(): out =
        model(x) ... loss.backward()".""",
        """Move the forward into the block: `with model.no_sync() if not stepping else
        nullcontext(): loss = loss_fn(model(x), y); loss.backward()` (or
        gpu_training.ddp.gradient_sync(model, enabled=stepping)).""",
        ("dist", "Gradient accumulation under DDP"),
        ("tutorial", "Gradient Synchronisation and Communication"),
    ),
    _rule(
        "GT017",
        "node-local-rank-write",
        "file written on local rank 0: one writer per node, all writing the same path",
        """LOCAL_RANK is the GPU index within a node ("0-3 for 4 GPUs; RANK is the global
        process rank"), so `if local_rank == 0:` holds on one process of every node. On two
        nodes sharing a filesystem, two processes write the same checkpoint at once - the
        corruption a rank-0 guard exists to prevent. Hugging Face's
        `TrainingArguments(save_on_each_node=True)` makes the Trainer do the same. (Writes
        whose path names the node or the rank are not flagged.)""",
        """Guard writes to shared storage with the global rank: `if dist.get_rank() == 0:` (or
        ctx.is_main_process, accelerator.is_main_process); keep LOCAL_RANK for node-local
        work (a download into a local cache, the GPU index).""",
        ("tutorial", "Launching with torchrun"),
        ("dist", "Checkpointing without corrupting files"),
    ),
    _rule(
        "GT018",
        "device-from-global-rank",
        "GPU index taken from the global rank: on a second node it names a GPU that is not there",
        """The GPU a process drives is its LOCAL_RANK, "the GPU index within the node"; the
        global RANK runs to world_size - 1. On one node the two agree, so the script works
        until the second node, where rank 4 of a 4-GPU node asks for cuda:4 (invalid device
        ordinal) - or, taken modulo, silently shares a GPU.""",
        """torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) and use that index for
        .to()/device_ids/FSDP(device_id=) (gpu_training.ddp.resolve_device(ctx) does it).""",
        ("tutorial", "Launching with torchrun"),
        ("dist", "The process group mental model"),
    ),
    _rule(
        "GT019",
        "bf16-adam-no-master-weights",
        "bf16 parameters stepped by torch.optim Adam/AdamW without fp32 master weights",
        """The module itself was converted to bfloat16 (model.to(torch.bfloat16),
        model.bfloat16(), from_pretrained(..., torch_dtype=torch.bfloat16)) and its parameters
        handed to torch.optim.Adam/AdamW, which updates them in their own dtype. bfloat16 keeps
        8 bits of mantissa: a weight near 1e-2 moves only in steps of about 6e-5 (an update
        under half of that rounds away), while an Adam update is about lr (1e-4..1e-5), so
        small updates vanish, the others are rounded coarsely, and training stalls or
        degrades. Mixed precision keeps fp32 parameters (the "master weights") and computes
        in bf16. The Hugging Face Trainer's default optim ("adamw_torch") is such an
        optimizer: bf16=True adds autocast and converts nothing. (Not flagged: a DeepSpeed
        script, Accelerate's FSDP or DeepSpeed plugin, which keep or upcast to fp32,
        optimizers of other packages such as bitsandbytes or AnyPrecisionAdamW with Kahan
        summation, adapters that peft's get_peft_model adds to a bf16 base (they are fp32;
        diffusers' add_adapter makes them bf16, which is flagged), and a script that runs in one
        process only, with no process group, launcher or framework in sight: the linter
        checks distributed training.)""",
        """Keep the parameters in fp32 and compute in bf16: torch.autocast(device_type="cuda",
        dtype=torch.bfloat16) around the forward (gpu_training.amp.MixedPrecisionStepper(
        optimizer, "bf16")), FSDP's MixedPrecision(param_dtype=torch.bfloat16), or DeepSpeed's
        bf16 mode; or use an optimizer that keeps fp32 copies or compensated updates.""",
        ("amp", "Two ideas people conflate"),
        ("amp", "fp16 vs bf16: which to use"),
    ),
    _rule(
        "GT020",
        "forward-past-ddp",
        "the loss is computed on the module inside the DDP wrapper: gradients are never all-reduced",
        """DDP averages gradients only for a backward whose forward went through the wrapper:
        its forward arms the reducer, and the gradient hooks of a backward it did not arm do
        nothing. A loss from model.module(x), model.module.compute_loss(batch),
        accelerator.unwrap_model(model)(x), or from net(x) where model = DDP(net) is never run,
        backpropagates on each rank alone - no error, no warning - and each replica steps with
        its own gradients and drifts away from the others (Lightning Fabric: a method other than
        forward called on the set-up model, unless fabric.mark_forward_method names it). A side
        loss on model.module next to a forward through the wrapper is not flagged.""",
        """Run the training forward through the wrapper: loss = model(x) (put the loss inside the
        module's forward, or call compute_loss from it); in Fabric, fabric.mark_forward_method(
        model, "training_step"). Keep model.module for saving and for evaluation.""",
        ("tutorial", "Gradient Synchronisation and Communication"),
    ),
]

RULES: dict[str, Rule] = {rule.code: rule for rule in _RULE_LIST}
"""Every rule by code, in code order."""


def explain(code: str) -> str:
    """The long form of a rule, as ``gpu-training lint --explain CODE`` prints it.

    Args:
        code: A rule code such as ``"GT007"`` (case-insensitive).

    Returns:
        Several lines: title, explanation, fix and the guide sections it relies on.

    Raises:
        KeyError: If there is no such rule; the message lists the codes.

    Example:
        >>> "unscale_" in explain("gt012")
        True
    """
    rule = RULES.get(code.strip().upper())
    if rule is None:
        raise KeyError(f"no rule {code!r}: codes are {', '.join(RULES)}")
    wrap = textwrap.TextWrapper(width=88)
    lines = [f"{rule.code} {rule.name}: {rule.message}", ""]
    lines += wrap.wrap(rule.explanation)
    lines += ["", *wrap.wrap("Fix: " + rule.fix), ""]
    lines += [f'Guide: {GUIDES[guide]}, "{section}"' for guide, section in rule.cites]
    return "\n".join(lines)
