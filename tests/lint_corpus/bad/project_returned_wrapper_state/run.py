import os

import torch
import torch.distributed as dist
from fit import fit


class Tracker:
    def save_checkpoint(self, states):
        torch.save(states, "best.pt")


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    states, score = fit(3)
    if dist.get_rank() == 0:
        Tracker().save_checkpoint(states)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
