# A sampler built inline in the DataLoader call, with shuffle=True beside it.
import torch
from torch.utils.data.distributed import DistributedSampler


def build(train_set, batch):
    return torch.utils.data.DataLoader(
        train_set,
        batch_size=batch,
        shuffle=True,  # expect: GT004
        sampler=DistributedSampler(train_set),
    )
