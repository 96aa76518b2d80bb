# The DDP wrapper's state_dict() is saved with `module.` keys, but the loader this script
# resumes through (infer.py, imported here) strips that prefix before load_state_dict (issue
# 33, round 12; sets 8 and 12): the checkpoint is read back, so GT006's failure does not happen.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from infer import load


def main(resume=None):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    plain = torch.nn.Linear(4, 1)
    if resume:
        plain = load(plain, resume)
    net = DDP(plain.cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1 * dist.get_world_size())
    for _ in range(10):
        loss = net(torch.randn(8, 4).cuda()).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if dist.get_rank() == 0:
        torch.save({"net": net.state_dict()}, "last.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
