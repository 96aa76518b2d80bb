# The global rank computed from the environment (issue 33, round 6): under SLURM the node's
# index times its GPUs plus the local index; without SLURM (one node, mp.spawn) the local
# index is the global rank. `rank == 0` is then one process of the whole job: one writer.
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def train(local_rank, world_size, output_dir):
    if "SLURM_PROCID" in os.environ:
        # the same number of GPUs on every node
        rank = int(os.environ["SLURM_PROCID"]) * torch.cuda.device_count() + local_rank
    else:
        rank = local_rank
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(local_rank)
    model = torch.nn.Linear(4, 1).cuda()
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(output_dir, "model.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = int(os.environ.get("WORLD_SIZE", torch.cuda.device_count()))
    mp.spawn(train, args=(world_size, "out"), nprocs=torch.cuda.device_count())
