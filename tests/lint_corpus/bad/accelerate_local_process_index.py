# Accelerate's node-local rank under its own name: `accelerator.local_process_index == 0` holds
# on one process of every node, so on two nodes sharing a filesystem two processes write the
# same checkpoint at once (the global one is `accelerator.process_index`). Issue 33, round 7.
import os

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader


class TrainState:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    def save(self, path):
        os.makedirs(path, exist_ok=True)
        torch.save(self.model.state_dict(), os.path.join(path, "model.pth"))  # expect: GT017


def main():
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * accelerator.num_processes)
    state = TrainState(model, optimizer)
    loader = DataLoader(torch.randn(64, 4), batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        accelerator.backward(model(batch).sum())
        optimizer.step()
        optimizer.zero_grad()
    if accelerator.local_process_index == 0:
        state.save("ckpt")
    if accelerator.process_index == 0:
        torch.save(optimizer.state_dict(), "optimizer.pth")


if __name__ == "__main__":
    main()
