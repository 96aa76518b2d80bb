# The model is wrapped inside a nested builder that returns (model, optimizer); the caller
# unpacks it and saves model.state_dict(): the DDP wrapper's, with "module." keys.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(use_fsdp=False):
    dist.init_process_group("nccl")
    gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(gpu)

    def build():
        net = torch.nn.Linear(2, 2).cuda()
        net = DDP(net, device_ids=[gpu])
        return net, torch.optim.AdamW(net.parameters(), lr=1e-3 * dist.get_world_size())

    net, optim = build()
    net(torch.randn(2, 2).cuda()).sum().backward()
    optim.step()
    if dist.get_rank() == 0:
        torch.save(net.state_dict(), "net.pt")  # expect: GT006
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
