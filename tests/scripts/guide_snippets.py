"""Every code snippet of the guide's DDP and mixed-precision parts, as written.

The snippets (../shared/seeds/000_484cbfa2625fcf2e.txt) are copied verbatim between
``# --- guide`` markers; only the glue around them (a dataset, a model, a loss) is ours.
Run under torchrun with 2 gloo ranks by tests/test_guide.py; prints ``GUIDE-OK <rank>``.
"""

from contextlib import nullcontext

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

# --- guide: the process group mental model
from gpu_training.ddp import init_distributed, resolve_device

ctx = init_distributed(backend="nccl")   # nccl for GPUs, gloo for CPU
device = resolve_device(ctx)             # cuda:<local_rank>
# --- end

# --- guide: launching with torchrun
from gpu_training.launcher import single_node_command, multi_node_commands

# Single node, 4 GPUs:
print(single_node_command("examples/train_ddp.py", 4, ["--epochs", "3"]))
# -> torchrun --standalone --nproc_per_node=4 examples/train_ddp.py --epochs 3

# Two nodes, 8 GPUs each (run the matching line on each node):
for cmd in multi_node_commands("examples/train_ddp.py", nnodes=2,
                               nproc_per_node=8, rdzv_endpoint="head-node:29500"):
    print(cmd)
# --- end

# --- guide: effective batch size
from gpu_training.config import TrainingConfig, gradient_accumulation_for_target

accum = gradient_accumulation_for_target(target_effective_batch=512,
                                         per_device_batch_size=8, world_size=4)
cfg = TrainingConfig(per_device_batch_size=8, gradient_accumulation_steps=accum,
                     world_size=4)
assert cfg.effective_batch_size >= 512
print(cfg.describe(num_samples=1_000_000))
# --- end

# glue: a small regression dataset and model
g = torch.Generator().manual_seed(0)
dataset = TensorDataset(torch.randn(256, 8, generator=g), torch.randn(256, 2, generator=g))
torch.manual_seed(0)
model = DDP(nn.Linear(8, 2).to(device))
loss_fn = nn.MSELoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

# --- guide: sharding data correctly
from gpu_training.ddp import make_distributed_sampler

sampler = make_distributed_sampler(dataset, ctx, shuffle=True, seed=42)
loader = DataLoader(dataset, batch_size=cfg.per_device_batch_size,
                    sampler=sampler, shuffle=(sampler is None))
# --- end

# glue: the accumulation snippet drives a MixedPrecisionTrainer and reads `x, y` although it
# enumerates `batch`; we bind x, y to the first batch so it runs exactly as written.
from gpu_training.amp import MixedPrecisionTrainer

trainer = MixedPrecisionTrainer(optimizer, precision="fp32",
                                grad_accum_steps=cfg.gradient_accumulation_steps)
x, y = next(iter(loader))

# --- guide: gradient accumulation under DDP
from gpu_training.amp import should_step

for micro_step, batch in enumerate(loader):
    stepping = should_step(micro_step, cfg.gradient_accumulation_steps)
    sync_context = nullcontext() if stepping else model.no_sync()
    with sync_context:
        with trainer.autocast():
            loss = loss_fn(model(x), y)
        trainer.backward(loss)
    trainer.step(model.parameters(), micro_step)   # no-ops until `stepping`
# --- end
assert micro_step + 1 == cfg.gradient_accumulation_steps  # 16 micro-batches: one step

# glue
local_loss = loss.item()

# --- guide: logging metrics across ranks
from gpu_training.ddp import reduce_scalar_dict

reduced = reduce_scalar_dict({"loss": local_loss}, ctx, average=True)
if ctx.is_main_process:
    print(f"global loss = {reduced['loss']:.4f}")
# --- end

# glue
epoch, global_step = 0, 1

# --- guide: checkpointing without corrupting files
from gpu_training.ddp import unwrap_model
from gpu_training.checkpoint import CheckpointManager

ckpt = CheckpointManager("checkpoints", ctx=ctx, keep_last_n=3)
ckpt.save(state={"model_state": unwrap_model(model).state_dict(),
                 "optimizer_state": optimizer.state_dict(),
                 "epoch": epoch},
          step=global_step)
# --- end
assert ckpt.latest() is not None

# --- guide: mixed precision, which to use
from gpu_training.amp import needs_grad_scaler
needs_grad_scaler("fp16")  # True
needs_grad_scaler("bf16")  # False
# --- end
assert needs_grad_scaler("fp16") and not needs_grad_scaler("bf16")

# --- guide: the correct training step
from gpu_training.amp import MixedPrecisionTrainer

trainer = MixedPrecisionTrainer(optimizer, precision="bf16",
                                grad_accum_steps=4, max_grad_norm=1.0)

for micro_step, (x, y) in enumerate(loader):
    with trainer.autocast():          # autocast in bf16 (or nullcontext for fp32)
        loss = loss_fn(model(x), y)
    trainer.backward(loss)            # scales loss, divides by accum, backward
    grad_norm = trainer.step(model.parameters(), micro_step)  # steps on boundary
# --- end
assert grad_norm is not None

# glue: a `fits` that reports a memory budget of 300 samples
def fits(batch: int) -> bool:
    return batch <= 300

# --- guide: memory savings and the batch finder
from gpu_training.profiling import find_max_batch_size

# `fits(batch)` runs a forward+backward and reports False on CUDA OOM.
best = find_max_batch_size(fits, min_batch=1, max_batch=1024, safety_margin=0.85)
# --- end
assert best == int(0.85 * 300), best

del model  # free DDP's reducer before the group goes

# --- guide: tearing down
from gpu_training.ddp import cleanup_distributed
cleanup_distributed()   # idempotent; safe to call once on every rank
# --- end
cleanup_distributed()
print(f"GUIDE-OK {ctx.rank}", flush=True)
