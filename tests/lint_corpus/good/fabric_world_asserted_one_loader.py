# A Fabric script that stops unless it runs in one process (a world size other than 1 raises),
# then builds a plain shuffled DataLoader it does not hand to setup_dataloaders: one process
# reads it, so no rank is missing its shard.
import torch
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset


def main():
    fabric = Fabric(accelerator="cuda", devices="auto", strategy="ddp")
    fabric.launch()
    if fabric.world_size > 1:
        raise ValueError("the probe loop below is written for one device")
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model, optimizer = fabric.setup(torch.nn.Linear(4, 1), torch.optim.SGD([], lr=0.1 * fabric.world_size))
    for x, y in loader:
        optimizer.zero_grad()
        fabric.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()


main()
