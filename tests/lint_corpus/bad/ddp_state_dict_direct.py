# The wrapper's state_dict straight into torch.save: every key gets a "module." prefix.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

model = torch.nn.Linear(4, 4)
model = DDP(model)
if dist.get_rank() == 0:
    torch.save(model.state_dict(), "model.pt")  # expect: GT006
