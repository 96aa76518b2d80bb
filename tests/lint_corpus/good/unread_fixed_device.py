# A fixed "cuda:0" device that no line reads places nothing there: the model and batches go
# to the process's own GPU through explicit indices.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Runner:
    def __init__(self):
        self.device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        self.gpu = int(os.environ["LOCAL_RANK"])
        self.model = DDP(torch.nn.Linear(2, 2).to(self.gpu), device_ids=[self.gpu])

    def step(self, batch):
        return self.model(batch.to(self.gpu)).sum()


if __name__ == "__main__":
    dist.init_process_group("nccl")
    fallback = torch.device("cuda:0")
    Runner().step(torch.randn(2, 2)).backward()
    dist.destroy_process_group()
