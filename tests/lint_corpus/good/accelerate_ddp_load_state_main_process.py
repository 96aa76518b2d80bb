# Accelerate's load_state under DDP (no FSDP or DeepSpeed plugin, no such config in the
# repository) reads the saved files in each process alone: no collective, so loading them on
# the main process only, for an evaluation there, hangs nothing. (Under FSDP or DeepSpeed it
# loads per-rank shards and every process must call it.)
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader


def main(config, model, optimizer, train_set, test_set):
    accelerator = Accelerator()
    loader = DataLoader(train_set, batch_size=32, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch, target in loader:
        loss = torch.nn.functional.mse_loss(model(batch), target)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.save_state(config["checkpoint"])
    if accelerator.is_main_process:
        accelerator.load_state(config["checkpoint"])
        with torch.no_grad():
            for batch, target in DataLoader(test_set, batch_size=32):
                print(torch.nn.functional.mse_loss(model.module(batch), target).item())
