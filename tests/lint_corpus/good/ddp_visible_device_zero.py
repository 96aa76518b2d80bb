# Each process sees one GPU (CUDA_VISIBLE_DEVICES narrowed to its local rank before CUDA
# starts): device 0 is the process's own card, so device_ids=[0] is right on every rank.
import os

local_rank = int(os.environ["LOCAL_RANK"])
os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

dist.init_process_group("nccl")
torch.cuda.set_device(0)
model = DDP(torch.nn.Linear(8, 8).cuda(), device_ids=[0], output_device=0)
for _ in range(2):
    model(torch.randn(4, 8).cuda()).sum().backward()
dist.destroy_process_group()
