# Constant learning rates in DDP scripts: a module constant, a literal and the default.
import torch
from torch import optim
from torch.nn.parallel import DistributedDataParallel as DDP

LEARNING_RATE = 3e-4

model = DDP(torch.nn.Linear(2, 2))
opt_a = optim.Adam(model.parameters(), lr=LEARNING_RATE)  # expect: GT010
opt_b = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)  # expect: GT010
opt_c = torch.optim.AdamW(model.parameters())  # expect: GT010
