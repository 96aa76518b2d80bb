# Guide: PyTorch Distributed Training: Multi-GPU Guide 2025, "Using Accelerate (Easiest)"
# (shared/seeds/004). Verbatim.
from accelerate import Accelerator

accelerator = Accelerator()

# Prepare model, optimizer, dataloader
model, optimizer, dataloader = accelerator.prepare(
    model, optimizer, dataloader
)

for batch in dataloader:
    optimizer.zero_grad()
    outputs = model(**batch)
    loss = outputs.loss
    accelerator.backward(loss)
    optimizer.step()

# Save model (only on main process)
accelerator.wait_for_everyone()
if accelerator.is_main_process:
    accelerator.save_model(model, "checkpoint")
