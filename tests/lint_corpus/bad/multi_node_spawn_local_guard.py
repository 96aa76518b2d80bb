# A multi-node spawn worker: the group's rank is node * gpus + local index, and the save is
# guarded by the local index only: local rank 0 of every node writes the same checkpoint.
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(local_rank, args):
    rank = args.node_rank * args.gpus + local_rank
    dist.init_process_group("nccl", world_size=args.nodes * args.gpus, rank=rank)
    torch.cuda.set_device(local_rank)
    model = torch.nn.Linear(2, 2).cuda(local_rank)
    if local_rank == 0:
        torch.save(model.state_dict(), os.path.join(args.out, "last.pth"))  # expect: GT017
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=torch.cuda.device_count(), args=(None,))
