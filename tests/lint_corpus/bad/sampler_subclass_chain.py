# A two-level sampler hierarchy in one file, the shuffle passed by position: the grandchild is
# still a DistributedSampler with its epoch-seeded shuffle, and the epoch loop never reseeds it.
import torch
import torch.distributed as dist
from torch.utils import data


class BucketSampler(data.distributed.DistributedSampler):
    pass


class LengthBucketSampler(BucketSampler):
    def __init__(self, dataset, lengths, shuffle=True):
        super().__init__(dataset, shuffle=shuffle)
        self.lengths = lengths


def run(dataset, lengths, model, opt, epochs):
    dist.init_process_group("gloo")
    loader = data.DataLoader(dataset, sampler=LengthBucketSampler(dataset, lengths, True))
    for epoch in range(epochs):  # expect: GT005
        for x in loader:
            model(x).mean().backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    net = torch.nn.Linear(2, 2)
    run([], [], net, torch.optim.SGD(net.parameters(), lr=0.1 * 2), 3)
