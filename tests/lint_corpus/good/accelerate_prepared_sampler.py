# A DistributedSampler loader handed to Accelerate's prepare() (issue 33, round 8): the
# prepared loader sets its sampler's epoch each time it is iterated, so the epoch loop needs
# no set_epoch of its own.
import os

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dataset = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    sampler = DistributedSampler(dataset, shuffle=True)
    train_dataloader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3 * dist.get_world_size())
    accelerator = Accelerator()
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    for epoch in range(10):
        for x, y in train_dataloader:
            loss = (model(x) - y).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
