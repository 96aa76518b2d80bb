# Project sampler subclasses used right: set_epoch every epoch, and one built with
# shuffle=False by position (a fixed order needs no reseeding).
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


class ResumableSampler(DistributedSampler):
    def __init__(self, dataset, shuffle=True, seed=0):
        super().__init__(dataset, shuffle=shuffle, seed=seed)
        self.start_index = 0


def train(dataset, model, opt, epochs):
    sampler = ResumableSampler(dataset)
    loader = DataLoader(dataset, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x in loader:
            model(x).mean().backward()
            opt.step()


def evaluate_in_order(dataset, model, epochs):
    loader = DataLoader(dataset, sampler=ResumableSampler(dataset, False))
    for _ in range(epochs):
        for x in loader:
            model(x)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    net = torch.nn.Linear(2, 2)
    train([], net, torch.optim.SGD(net.parameters(), lr=0.1 * dist.get_world_size()), 2)
    evaluate_in_order([], net, 2)
    dist.destroy_process_group()
