# One example batch drawn from a throwaway loader (issue 33, round 8), to trace a pipeline
# with: no epoch of training runs over it, so it needs no DistributedSampler. The training
# loader has one.
import os

import torch
import torch.distributed as dist
from torch.distributed.pipelining import pipeline
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    example = next(iter(DataLoader(data, batch_size=1)))
    pipe = pipeline(module=model, mb_args=(example[0],))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            pass
    del pipe
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
