# A loader builder of the project (issue 33): it knows nothing of the process group and
# builds its DataLoader with no sampler (the DistributedSampler is commented out). The
# spawned DDP ranks of train_ddp.py train on what it returns: every rank, the same batches.
from torch.utils.data import DataLoader


def create_dataloader(dataset, batch_size=4, shuffle=False, world_size=2, rank=0):
    sampler = None
    # sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    dataloader = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler)
    return dataloader
