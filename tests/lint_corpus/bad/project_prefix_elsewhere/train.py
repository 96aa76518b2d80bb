# The wrapper's `module.` keys are saved, and the project's loader strips another prefix
# (torch.compile's `_orig_mod.`), while the only `module.` removal renames keys for a log
# table and loads nothing, and deploy.py (not imported here) strips it for itself only: the
# checkpoint still fails to load into a plain model on this script's paths.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from report import describe, restore


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = restore(torch.nn.Linear(4, 1), "init.pt").cuda()
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    for _ in range(10):
        loss = model(torch.randn(8, 4).cuda()).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if dist.get_rank() == 0:
        describe(model.state_dict())
        torch.save(model.state_dict(), "final.pt")  # expect: GT006
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
