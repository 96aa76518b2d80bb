# shuffle=True next to a sampler: DataLoader raises "sampler option is mutually exclusive
# with shuffle" - by keyword, by position and with a batch sampler.
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from gpu_training.data import GlobalBatchSampler

sampler = DistributedSampler(dataset)
a = DataLoader(dataset, batch_size=8, sampler=sampler, shuffle=True)  # expect: GT004
b = DataLoader(dataset, 8, True, sampler)  # expect: GT004
batches = GlobalBatchSampler(len(dataset), 64, 8, ctx)
c = DataLoader(dataset, batch_sampler=batches, shuffle=True)  # expect: GT004
