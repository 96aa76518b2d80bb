# An MPI-launched DDP script: the config is dumped before any rank test.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from common.records import dump_rank_config, dump_run_config


def main(cfg, model, loader, optimizer):
    dump_run_config(cfg)  # expect: GT007
    dist.init_process_group("nccl")
    dump_rank_config(cfg, dist.get_rank())
    model = DistributedDataParallel(model)
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    dist.destroy_process_group()
