# Saved under the node-local rank through an object a function of another module returns.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import state as training_state


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = torch.nn.Linear(4, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    state = training_state.make_state(model, optimizer)
    ddp = DDP(model, device_ids=[local_rank])
    for _ in range(10):
        ddp(torch.randn(8, 4).cuda()).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    if local_rank == 0:
        state.save("ckpt")  # expect: GT017
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
