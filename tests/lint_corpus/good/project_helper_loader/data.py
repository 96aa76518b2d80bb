# The loader builders of bad/project_helper_loader/ done right (issue 33): the ones the DDP
# ranks train on build a DistributedSampler or a dataset of the rank's share; the one with
# no sampler at all is used by a one-process script (train_single.py) only.
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def create_dataloader(dataset, batch_size=4, world_size=2, rank=0):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)


def create_local_dataloader(dataset, batch_size=4):
    sampler = None
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, sampler=sampler)


class ShardedDataset:
    def __init__(self, dataset, rank, world_size):
        self.items = [dataset[i] for i in range(rank, len(dataset), world_size)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def create_sharded_loader(dataset, batch_size, rank, world_size):
    # the dataset keeps this rank's share itself: no sampler needed
    shard = ShardedDataset(dataset, rank=rank, world_size=world_size)
    return DataLoader(shard, batch_size=batch_size, sampler=None)
