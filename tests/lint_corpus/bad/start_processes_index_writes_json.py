# torch.multiprocessing.start_processes hands its target the process index on this machine;
# the worker names it local_idx and writes the run's metrics file when it is 0, while the
# group's rank comes from the node rank: one writer per node, all to the same file.
import json
import os

import torch
import torch.distributed as dist
from torch.multiprocessing import start_processes


def run(local_idx, nprocs, cfg):
    rank = int(os.environ["NODE_RANK"]) * nprocs + local_idx
    dist.init_process_group("nccl", rank=rank, world_size=cfg["world_size"])
    torch.cuda.set_device(local_idx)
    metrics = {"loss": float(torch.rand(1))}
    if local_idx == 0:
        with open(os.path.join(cfg["out"], "metrics.json"), "w") as f:  # expect: GT017
            json.dump(metrics, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    count = torch.cuda.device_count()
    start_processes(
        run, args=(count, {"world_size": 2 * count, "out": "runs"}), nprocs=count
    )
