# The project's own sampler, a DistributedSampler subclass that can resume mid-epoch; the
# loader builder shuffles it (shuffle=True from the script) and nobody sets its epoch.
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


class ResumableSampler(DistributedSampler):
    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.start_index = 0

    def __iter__(self):
        return iter(list(super().__iter__())[self.start_index :])


def make_loader(dataset, batch_size=1, shuffle=False, seed=1024):
    sampler = ResumableSampler(
        dataset, dist.get_world_size(), dist.get_rank(), shuffle=shuffle, seed=seed
    )
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)
