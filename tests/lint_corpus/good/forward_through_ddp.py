# The forward runs through the DDP wrapper (or Fabric names the method), so every backward
# is all-reduced: model.module only for a side loss beside the wrapper's forward, under
# no_grad for evaluation, and for saving (no GT020).
import os

import lightning as L
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(net, loader, optimizer):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(net.cuda(), device_ids=[local_rank])
    for x, y in loader:
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y) + 0.1 * model.module.regularizer()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            ema_out = model.module(x)
        print(float(ema_out.mean()))
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "model.pt")
    dist.destroy_process_group()


def fabric_train(model, dataset):
    fabric = L.Fabric(accelerator="cuda", devices=4, strategy="ddp")
    fabric.launch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4 * fabric.world_size)
    model, optimizer = fabric.setup(model, optimizer)
    fabric.mark_forward_method(model, "shared_step")
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(dataset, batch_size=8))
    for batch in loader:
        loss = model.shared_step(batch) + model.training_step(batch)  # both through forward
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
