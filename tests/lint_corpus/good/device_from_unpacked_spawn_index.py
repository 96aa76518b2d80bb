# mp.spawn hands each process its index on this machine; a setup helper that returns it in a
# tuple returns the local index, a right device index.
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def setup(rank, world_size):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    return rank, world_size


def worker(index, world_size):
    rank, _world = setup(index, world_size)
    torch.cuda.set_device(rank)
    model = torch.nn.Linear(2, 2).cuda()
    model(torch.randn(2, 2, device="cuda")).sum().backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(torch.cuda.device_count(),), nprocs=torch.cuda.device_count())
