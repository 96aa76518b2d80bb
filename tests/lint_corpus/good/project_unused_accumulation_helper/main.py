import os

import torch
import torch.distributed as dist
from loops import fit_epoch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main(dataset, epochs=3):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(8, 1).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3 * dist.get_world_size())
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        fit_epoch(model, loader, optimizer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1)))
