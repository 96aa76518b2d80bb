# Returned states done right: the unwrapped module's state_dict() goes to the saver, and the
# wrapper's own state_dict() is only kept to be loaded back into the same wrapper.
import copy
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def fit(model, epochs):
    best = None
    for _ in range(epochs):
        model(torch.randn(2, 2).cuda()).sum().backward()
        best = copy.deepcopy(model.state_dict())
    return {"model": model.module.state_dict()}, best


def main():
    dist.init_process_group("nccl")
    gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(gpu)
    model = DDP(torch.nn.Linear(2, 2).cuda(), device_ids=[gpu])
    checkpoint, best = fit(model, 2)
    model.load_state_dict(best)
    if dist.get_rank() == 0:
        torch.save(checkpoint, "final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
