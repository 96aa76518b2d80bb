# A script that trains on a sharded loader and also probes the model on a second loader with
# no sampler, under torch.no_grad() (issue 33): the probe's batches never reach a backward,
# and every rank may read the same ones.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main(dataset, probe_set):
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    probes = DataLoader(probe_set, batch_size=8)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        with torch.no_grad():
            for x, _ in probes:
                model(x)
    dist.destroy_process_group()
