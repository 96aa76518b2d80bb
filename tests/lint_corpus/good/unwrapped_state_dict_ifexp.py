# The unwrapped model's weights, whichever the model is: `.module` when it is wrapped, the
# model itself when it is not (issue 33).
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(model, local_rank, path):
    dist.init_process_group("nccl")
    torch.cuda.set_device(local_rank)
    net = DDP(model.cuda(), device_ids=[local_rank])
    state = net.module.state_dict() if hasattr(net, "module") else net.state_dict()
    if dist.get_rank() == 0:
        torch.save(state, path)
    dist.destroy_process_group()
