# A Trainer whose per-batch step() backpropagates on every call and steps every accum calls
# (issue 33: accumulation inside a class): no no_sync(), so every micro-batch all-reduces; and
# a GradScaler next to bf16 autocast.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, local_rank):
        dist.init_process_group("nccl")
        torch.cuda.set_device(local_rank)
        self.model = DDP(model.cuda(), device_ids=[local_rank])
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)  # expect: GT010
        self.scaler = torch.cuda.amp.GradScaler()  # expect: GT011
        self.accum = 4

    def step(self, batch, i):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.model(batch).sum() / self.accum
        self.scaler.scale(loss).backward()  # expect: GT013
        if (i + 1) % self.accum == 0:
            self.scaler.step(self.opt)
            self.scaler.update()
            self.opt.zero_grad()

    def close(self):
        dist.destroy_process_group()
