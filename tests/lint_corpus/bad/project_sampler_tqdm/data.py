# The loader helper of the project (issue 33, round 7): a shuffling DistributedSampler on the
# distributed path, plain shuffling otherwise. It never reseeds the sampler itself.
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Pairs(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.randn(4), torch.randn(1)


def get_loader(batch_size, distributed=False):
    dataset = Pairs()
    if distributed:
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=sampler)
    else:
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
    return loader
