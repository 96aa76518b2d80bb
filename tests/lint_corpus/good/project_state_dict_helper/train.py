import copy
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from checkpoints import save_check_point, save_model


def main(args, loader):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    net = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
    best = None
    for epoch in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(x.cuda()), y.cuda()).backward()
            optimizer.step()
        best = copy.deepcopy(net.module)
        if dist.get_rank() == 0:
            save_model(net.module, optimizer, epoch, args.out)
            save_check_point(net.module, args.out, args)
    if dist.get_rank() == 0:
        torch.save(best.state_dict(), "best.pth")
    dist.destroy_process_group()
