# A training page of the project (issue 33, round 7): it trains in its own process and never
# creates a process group, so the helper's DistributedSampler path (a hidden option, False)
# cannot run here; the epoch loop needs no set_epoch.
import torch

from data import get_loader


def train_from_page(epochs, batch_size, distributed=False):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = get_loader(batch_size=batch_size, distributed=distributed)
    for epoch in range(epochs):
        for x, y in loader:
            loss = (model(x) - y).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model
