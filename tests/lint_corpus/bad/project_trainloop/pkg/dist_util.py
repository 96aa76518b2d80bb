# improved-diffusion-style: the group is set up in a helper module.
import os

import torch.distributed as dist


def setup_dist():
    if dist.is_initialized():
        return
    os.environ["MASTER_PORT"] = "29500"
    dist.init_process_group(backend="nccl", init_method="env://")
