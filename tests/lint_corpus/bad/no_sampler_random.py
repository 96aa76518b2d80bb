# A sampler is given, but it is a RandomSampler: not sharded across ranks.
from torch.utils.data import DataLoader, RandomSampler

from gpu_training.ddp import cleanup_distributed, init_distributed

ctx = init_distributed()
sampler = RandomSampler(dataset)
loader = DataLoader(dataset, batch_size=16, sampler=sampler)  # expect: GT003
cleanup_distributed()
