# A Fabric script that saves its best checkpoint when this rank's validation score beats the
# best so far (issue 33, round 10): the score is summed over the rank's own shard of the
# validation loader and never reduced, so some ranks enter fabric.save (a barrier) and the
# others do not.
import lightning as L
import torch

if __name__ == "__main__":
    fabric = L.Fabric(accelerator="cuda", devices=4, strategy="ddp")
    fabric.launch()
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3 * fabric.world_size)
    model, optimizer = fabric.setup(model, optimizer)
    train_set = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    train_loader, val_loader = fabric.setup_dataloaders(
        torch.utils.data.DataLoader(train_set, batch_size=8, shuffle=True),
        torch.utils.data.DataLoader(train_set, batch_size=8),
    )
    best = 0.0
    for epoch in range(5):
        for x, y in train_loader:
            optimizer.zero_grad()
            fabric.backward(torch.nn.functional.cross_entropy(model(x), y))
            optimizer.step()
        correct = 0.0
        with torch.no_grad():
            for x, y in val_loader:
                correct += (model(x).argmax(-1) == y).float().sum().item()
        if correct > best:
            best = correct
            fabric.save("best.ckpt", {"model": model})  # expect: GT009
        fabric.save("last.ckpt", {"model": model})
