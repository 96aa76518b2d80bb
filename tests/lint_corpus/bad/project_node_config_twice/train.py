# The same helper called from two places under the node-local rank (issue 33, round 12): the
# config at start-up and again when the best threshold is found. Each guarded call is local
# rank 0 of every node rewriting the shared file; each is reported, with the helper's write.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from configio import RunRecord, write_config


def main(cfg):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    record = RunRecord(cfg["out"])
    if local_rank == 0:
        write_config(cfg, os.path.join(cfg["out"], "config.json"))  # expect: GT017
    best = None
    for _ in range(10):
        loss = model(torch.randn(8, 4).cuda()).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if best is None or loss.item() < best:
            best = loss.item()
            cfg["best"] = best
            if local_rank == 0:
                write_config(cfg, os.path.join(cfg["out"], "config.json"))  # expect: GT017
                record.dump({"best": best})  # expect: GT017
    dist.destroy_process_group()


if __name__ == "__main__":
    main({"out": "runs"})
