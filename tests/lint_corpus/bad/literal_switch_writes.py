# The distributed side of switches spelled with a literal (issue 33) stays distributed: a
# save in the body of `if args.mode == "ON":` or in the `else:` of `if args.mode == "OFF":`
# runs on every rank of the group those branches create.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(args, model):
    if args.mode == "ON":
        dist.init_process_group("nccl")
        ddp_model = DDP(model)
        torch.save(ddp_model.module.state_dict(), "a.pt")  # expect: GT007
    if args.mode == "OFF":
        torch.save(model.state_dict(), "b.pt")
    else:
        torch.save(model.state_dict(), "c.pt")  # expect: GT007
    if args.mode != "OFF":
        dist.destroy_process_group()
