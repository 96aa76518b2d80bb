# An mp.spawn launch over several nodes (issue 33, set 12): the worker's first argument is the
# process index on its machine, kept as opt.gpu; the global rank is node * ngpus + gpu. The
# checkpoint is saved under `opt.gpu == 0`: local rank 0 of every node writes the same path.
import argparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def main_worker(gpu, ngpus_per_node, opt):
    opt.gpu = gpu
    opt.rank = opt.node_rank * ngpus_per_node + gpu
    dist.init_process_group(
        "nccl", init_method=opt.dist_url, world_size=opt.world_size, rank=opt.rank
    )
    torch.cuda.set_device(opt.gpu)
    model = DDP(torch.nn.Linear(8, 8).cuda(opt.gpu), device_ids=[opt.gpu])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * opt.world_size)
    for _ in range(opt.epochs):
        loss = model(torch.randn(4, 8, device=opt.gpu)).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if opt.gpu == 0:
        path = f"{opt.save_dir}/last.pth"
        torch.save(model.module.state_dict(), path)  # expect: GT017
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--node_rank", type=int, default=0)
    opt = parser.parse_args()
    ngpus_per_node = torch.cuda.device_count()
    opt.world_size = ngpus_per_node * opt.nodes
    mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, opt))


if __name__ == "__main__":
    main()
