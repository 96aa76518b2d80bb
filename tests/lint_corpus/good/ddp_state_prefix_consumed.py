# One script that saves the engine's `module.`-prefixed state and resumes from it with torch's
# consume_prefix_in_state_dict_if_present: the keys are made plain where they are read.
import os

import torch
import torch.distributed as dist
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.nn.parallel import DistributedDataParallel


def main(resume=None):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = torch.nn.Linear(4, 1).cuda()
    if resume:
        saved = torch.load(resume, map_location="cpu")
        consume_prefix_in_state_dict_if_present(saved, "module.")
        model.load_state_dict(saved)
    model = DistributedDataParallel(model, device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    for _ in range(10):
        loss = model(torch.randn(8, 4).cuda()).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
