import os

import torch
import torch.distributed as dist
from data import make_loader


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = torch.nn.Linear(4, 4).cuda()
    optim = torch.optim.SGD(model.parameters(), lr=0.01 * dist.get_world_size())
    loader = make_loader(list(range(64)), batch_size=8, shuffle=True)
    for _epoch in range(4):  # expect: GT005
        for batch in loader:
            model(batch.cuda()).sum().backward()
            optim.step()
            optim.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
