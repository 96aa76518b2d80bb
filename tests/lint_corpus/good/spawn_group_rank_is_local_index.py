# A one-machine spawn worker: the group is created with the spawn index as its rank, so the
# index, however it is named (`local_rank`, `args.gpu`), is the global rank, and a guard on it
# holds on one process of the whole job.
import datetime

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(local_rank, world, args):
    args.gpu = local_rank
    dist.init_process_group(
        "nccl", init_method="tcp://127.0.0.1:23456", world_size=world, rank=local_rank
    )
    torch.cuda.set_device(local_rank)
    model = torch.nn.Linear(2, 2).cuda(local_rank)
    if args.gpu == 0:
        torch.save(model.state_dict(), "checkpoint.pth")
    dist.destroy_process_group()


def positional_worker(gpu, world):
    node_local_rank = gpu
    timeout = datetime.timedelta(minutes=5)
    dist.init_process_group("gloo", "tcp://127.0.0.1:29500", timeout, world, node_local_rank)
    if node_local_rank == 0:
        with open("metrics.json", "w") as f:
            f.write("{}")
    dist.destroy_process_group()


if __name__ == "__main__":
    n = torch.cuda.device_count()
    mp.spawn(worker, nprocs=n, args=(n, None))
    mp.spawn(positional_worker, nprocs=n, args=(n,))
