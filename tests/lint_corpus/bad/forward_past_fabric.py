# Lightning Fabric: a method other than forward() called on the set-up model runs the module
# past Fabric's DDP wrapper unless fabric.mark_forward_method() names it, and so does any call
# on its .module (GT020). training_step() and the other LightningModule step methods Fabric
# sends through the forward itself (good/forward_through_ddp.py).
import lightning as L
import torch


def main(model, dataset):
    fabric = L.Fabric(accelerator="cuda", devices=4, strategy="ddp")
    fabric.launch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4 * fabric.world_size)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(dataset, batch_size=8))
    for batch in loader:
        out = model.shared_step(batch)  # expect: GT020
        aux = model.module(batch["x"]).pow(2).mean()  # expect: GT020
        fabric.backward(out["loss"] + aux)
        optimizer.step()
        optimizer.zero_grad()
