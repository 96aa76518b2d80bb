import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from trainer import Trainer


def main(dataset):
    dist.init_process_group("gloo")
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    Trainer(model, loader, optimizer, epochs=3)()
    dist.destroy_process_group()
