# Lightning's default DDP strategy over every GPU (`devices="auto"`, or a device count)
# re-runs this script in one process per device (issue 33): the saves after fit() run on
# every rank, all writing the same file.
import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy


def main(model, loader, epochs):
    trainer = L.Trainer(
        devices=torch.cuda.device_count(), strategy=DDPStrategy(), max_epochs=epochs
    )
    trainer.fit(model, loader)
    torch.save(model.state_dict(), "weights.pth")  # expect: GT007


if __name__ == "__main__":
    net, data = build()
    trainer = L.Trainer(accelerator="auto", devices="auto", strategy="auto")
    trainer.fit(model=net, train_dataloaders=data)
    torch.save(net, "model.pt")  # expect: GT007
