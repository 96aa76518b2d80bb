# The toolkit's way throughout: MixedPrecisionTrainer in bf16 (no scaler), gradient_sync,
# metrics reduced on every rank, CheckpointManager.save on every rank, a per-rank debug print.
import torch
from torch.utils.data import DataLoader

from gpu_training.amp import MixedPrecisionTrainer, should_step
from gpu_training.checkpoint import CheckpointManager
from gpu_training.config import TrainingConfig
from gpu_training.data import GlobalBatchSampler
from gpu_training.ddp import (
    cleanup_distributed,
    gradient_sync,
    init_distributed,
    reduce_scalar_dict,
    resolve_device,
    unwrap_model,
)
from gpu_training.strategy import wrap_model

ctx = init_distributed()
device = resolve_device(ctx)
try:
    cfg = TrainingConfig(per_device_batch_size=8, learning_rate=3e-4, base_batch_size=64)
    sampler = GlobalBatchSampler(len(dataset), 64, 8, ctx, seed=0)
    loader = DataLoader(dataset, batch_sampler=sampler)
    model = wrap_model(build_model().to(device), "ddp", ctx, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.scaled_learning_rate)
    amp = MixedPrecisionTrainer(optimizer, "bf16", sampler.gradient_accumulation_steps, 1.0)
    ckpt = CheckpointManager("runs/ckpt", ctx=ctx)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for micro, (x, y) in enumerate(loader):
            with gradient_sync(model, enabled=should_step(micro, amp.grad_accum_steps)):
                with amp.autocast():
                    loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
                amp.backward(loss)
            amp.step(model.parameters(), micro)
        print(f"[rank {ctx.rank}] epoch {epoch} done")
        metrics = reduce_scalar_dict({"loss": loss.detach()}, ctx)
        if ctx.is_main_process:
            print(f"epoch {epoch} loss {metrics['loss']:.4f}")
        ckpt.save({"model_state": unwrap_model(model).state_dict()}, step=epoch)
    del model
finally:
    cleanup_distributed()
