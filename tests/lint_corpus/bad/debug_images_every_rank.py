# Sample images saved for a look before training, in the code every process of a Fabric run
# executes (issue 33, round 10): Fabric's launch re-runs the script in each process, and the
# image's save("...png") writes the same file from all of them.
import lightning as L
import torch
from PIL import Image


def main(model, loader, samples):
    grid = Image.fromarray(samples)
    grid.save("train_debug.png")  # expect: GT007
    fabric = L.Fabric(accelerator="cuda", devices=4, strategy="ddp")
    fabric.launch()
    model, optimizer = fabric.setup(
        model, torch.optim.AdamW(model.parameters(), lr=1e-3 * fabric.world_size)
    )
    loader = fabric.setup_dataloaders(loader)
    for x, y in loader:
        fabric.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    if fabric.is_global_zero:
        grid.save("after_debug.png")
