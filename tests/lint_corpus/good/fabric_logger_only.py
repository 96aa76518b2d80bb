# A single-process script that builds a Fabric only to hold a TensorBoard logger: it never
# launches it nor sets anything up, so no processes start and no group exists; its writes
# are the one process's own.
import os

import lightning as L
import torch
from lightning.fabric.loggers import TensorBoardLogger


def main(args):
    device = torch.device("mps")
    os.makedirs(args.out, exist_ok=True)
    fabric = L.Fabric(loggers=TensorBoardLogger(root_dir=args.tb))
    model = build_model().to(device)
    optimizer = torch.optim.Adam(model.parameters())
    log_name = os.path.join(args.out, "log.txt")
    with open(log_name, "w") as f:
        f.write(str(model))
    for epoch in range(args.epochs):
        for x, y in build_loader():
            loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        fabric.log("loss", loss.item(), epoch)
        with open(log_name, "a") as f:
            f.write(f"{epoch} {loss.item()}\n")
        torch.save(model.state_dict(), os.path.join(args.out, "last.pth"))
