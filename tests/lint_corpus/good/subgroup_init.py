# RPC-style: two of the processes form a process group of their own (world_size=2) under a
# rank test; that is not a collective the others must reach.
import torch.distributed as dist
import torch.distributed.rpc as rpc


def run_worker(rank, world_size):
    if rank == 2:
        rpc.init_rpc("master", rank=rank, world_size=world_size)
    elif rank <= 1:
        dist.init_process_group(backend="gloo", rank=rank, world_size=2, init_method="tcp://localhost:29500")
        rpc.init_rpc(f"trainer{rank}", rank=rank, world_size=world_size)
        dist.destroy_process_group()
    rpc.shutdown()
