# Guide: Mixed-Precision Training (gpu_training), "The correct training step"
# (shared/seeds/000). Verbatim.
from gpu_training.amp import MixedPrecisionTrainer

trainer = MixedPrecisionTrainer(optimizer, precision="bf16",
                                grad_accum_steps=4, max_grad_norm=1.0)

for micro_step, (x, y) in enumerate(loader):
    with trainer.autocast():          # autocast in bf16 (or nullcontext for fp32)
        loss = loss_fn(model(x), y)
    trainer.backward(loss)            # scales loss, divides by accum, backward
    grad_norm = trainer.step(model.parameters(), micro_step)  # steps on boundary
