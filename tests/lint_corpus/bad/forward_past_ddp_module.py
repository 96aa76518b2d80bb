# The training loss computed on the module inside the DDP wrapper: model.module(x) and a
# method of model.module (a VAE-style loss), in the script and in a helper the wrapper is
# handed to. DDP's reducer is armed by the wrapper's forward only, so these backwards are
# never all-reduced and the replicas drift apart (GT020).
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class VAE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(8, 4)
        self.dec = torch.nn.Linear(4, 8)

    def forward(self, x):
        return self.dec(self.enc(x))

    def loss_function(self, x):
        return torch.nn.functional.mse_loss(self(x), x)


def fit(net, loader, optimizer, epochs):
    for _ in range(epochs):
        for x in loader:
            optimizer.zero_grad()
            loss = net.module.loss_function(x)
            loss.backward()
            optimizer.step()


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(VAE().cuda(), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3 * dist.get_world_size())
    loader = [torch.randn(16, 8).cuda() for _ in range(4)]
    fit(model, loader, optimizer, epochs=2)  # expect: GT020
    for x in loader:
        recon = model.module(x)  # expect: GT020
        loss = torch.nn.functional.mse_loss(recon, x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
