# set_device is there, but a hard-coded "cuda:0" still sends every rank to the first GPU.
import torch
import torch.distributed as dist

from gpu_training.ddp import cleanup_distributed, init_distributed

ctx = init_distributed()
state = torch.load("pretrained.pt", map_location="cuda:0")  # expect: GT002
model = torch.nn.Linear(4, 4).to("cuda:0")  # expect: GT002
model.load_state_dict(state)
dist.barrier()
cleanup_distributed()
