# A one-machine mp.spawn launch: the spawn index is passed as the group's rank, so it is the
# global rank and `if rank == 0` (under any name) is one writer in the whole job.
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(gpu, world_size, out):
    dist.init_process_group(
        "nccl", init_method="tcp://127.0.0.1:29500", rank=gpu, world_size=world_size
    )
    torch.cuda.set_device(gpu)
    model = DDP(torch.nn.Linear(8, 8).cuda(gpu), device_ids=[gpu])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * world_size)
    model(torch.randn(4, 8, device=gpu)).sum().backward()
    optimizer.step()
    if gpu == 0:
        torch.save(model.module.state_dict(), out)
    dist.destroy_process_group()


if __name__ == "__main__":
    n = torch.cuda.device_count()
    mp.spawn(worker, nprocs=n, args=(n, "model.pt"))
