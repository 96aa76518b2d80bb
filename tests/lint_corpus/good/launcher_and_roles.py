# Who prints is decided by the process layout: the parent that spawns the ranks prints once,
# RPC roles are single processes (`rank == 2`, a Process started on rank 0 only), and
# messages that say which process they come from are one line per process by design.
import os

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp


def run_parameter_server(rank, world_size):
    print("PS master initializing RPC")
    rpc.init_rpc(name="parameter_server", rank=rank, world_size=world_size)
    print("RPC initialized! Running parameter server...")
    rpc.shutdown()


def run_trainer():
    for epoch in range(10):
        train_one_epoch()
        print(f"Training epoch {epoch}")


def run_worker(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device(f"cuda:{local_rank}")
    print(f"Running on device {device}")
    print(f"[{os.getpid()}] initialized with world size {world_size}")
    if rank == 2:
        rpc.init_rpc("trainer", rank=rank, world_size=world_size)
        run_trainer()
    elif rank == 0:
        p = mp.Process(target=run_parameter_server, args=(0, world_size))
        p.start()
        p.join()
    dist.destroy_process_group()


def main():
    world_size = torch.cuda.device_count()
    print(f"Using {world_size} devices")
    mp.spawn(run_worker, args=(world_size,), nprocs=world_size, join=True)


if __name__ == "__main__":
    main()
    print("Distributed RPC example completed successfully.")
