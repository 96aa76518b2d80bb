# The same class-based trainer done right: the epoch helper reseeds the sampler it iterates.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


class Runner:
    def __init__(self, model, loader, opt, device):
        self.model = DDP(model.to(device), device_ids=[device])
        self.train_data = loader
        self.opt = opt

    def _one_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for x, y in self.train_data:
            self._step(x, y)

    def _step(self, x, y):
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def fit(self, epochs):
        for epoch in range(epochs):
            self._one_epoch(epoch)


def main(model, ds, local_rank):
    dist.init_process_group("nccl")
    torch.cuda.set_device(local_rank)
    loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds))
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    Runner(model, loader, opt, local_rank).fit(5)
    dist.destroy_process_group()
