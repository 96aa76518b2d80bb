# A Fabric script that keeps a results table through a helper class's method.
import lightning as L

from common.records import ResultTable


def run(model, loader, optimizer):
    fabric = L.Fabric(accelerator="cuda", devices=4, strategy="ddp")
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    table = ResultTable("results/table.csv")
    for x, y in loader:
        loss = model(x, y)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        table.flush([f"{loss.item()}\n"])  # expect: GT007
