# The same logger-holding Fabric, but launched: every process runs the script, and each one
# truncates and appends the shared log file.
import os

import lightning as L
import torch
from lightning.fabric.loggers import TensorBoardLogger


def main(args):
    fabric = L.Fabric(devices=2, strategy="ddp", loggers=TensorBoardLogger(root_dir=args.tb))
    fabric.launch()
    model, optimizer = fabric.setup(build_model(), build_optimizer())
    loader = fabric.setup_dataloaders(build_loader())
    log_name = os.path.join(args.out, "log.txt")
    with open(log_name, "w") as f:  # expect: GT007
        f.write(str(model))
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        fabric.log("loss", loss.item(), epoch)
