# Loader builders of the project (issue 33): a shuffling DistributedSampler is built here,
# the epoch loops live in train.py, and nothing in the project sets the sampler's epoch.
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def get_train_loader(dataset, batch_size, distributed):
    if distributed:
        sampler = DistributedSampler(dataset)
    else:
        sampler = torch.utils.data.RandomSampler(dataset)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler), len(dataset)


def get_file_loader(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, sampler=DistributedSampler(dataset))


def progress(iterable):
    return iter(iterable)
