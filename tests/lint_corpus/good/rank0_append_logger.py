# A logger every rank builds (issue 33): it opens its file for appending on every rank, but
# every write goes through a method that writes on rank 0 only. The other ranks create the
# file and truncate nothing: one process writes it.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Logger:
    def __init__(self, dirname, filename):
        os.makedirs(dirname, exist_ok=True)
        self.logout = open(os.path.join(dirname, filename), "a")

    def log_string(self, text):
        if dist.get_rank() == 0:
            self.logout.write(text + "\n")
            self.logout.flush()
            print(text)

    def close(self):
        self.logout.close()


def main(output_dir, lr):
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    logger = Logger(output_dir, "log.txt")
    model = DDP(torch.nn.Linear(4, 1).cuda())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(10):
        optimizer.zero_grad()
        loss = model(torch.randn(8, 4).cuda()).pow(2).mean()
        loss.backward()
        optimizer.step()
        logger.log_string(f"step {step} loss {loss.item():.4f}")
    logger.close()
    dist.destroy_process_group()
