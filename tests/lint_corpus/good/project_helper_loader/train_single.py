import torch

from data import create_local_dataloader


def train(dataset, lr):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in create_local_dataloader(dataset, batch_size=8):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
