# A torchrun benchmark that checks its launch before it starts (issue 33, set 12): a negative
# LOCAL_RANK or one that disagrees with --local_rank raises. A raise is no rank split: it fails
# the job (torchrun tears the others down), so the barriers and the all-reduce after it are
# reached by every rank that goes on.
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", args.local_rank))
    if local_rank < 0:
        raise RuntimeError("launch with torchrun --nproc_per_node=2")
    if args.local_rank >= 0 and args.local_rank != local_rank:
        raise RuntimeError("--local_rank and LOCAL_RANK disagree")
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    try:
        model = DDP(torch.nn.Linear(8, 8).cuda(), device_ids=[local_rank])
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3 * dist.get_world_size())
        for _ in range(10):
            loss = model(torch.randn(4, 8, device="cuda")).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        dist.barrier()
        elapsed = torch.tensor([1.0], device="cuda")
        dist.all_reduce(elapsed)
        if dist.get_rank() == 0:
            print(f"elapsed {elapsed.item():.2f}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
