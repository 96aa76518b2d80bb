# Saves under the project's rank-0 predicates, the function and the method of the same name.
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from agent import Agent
from pkg.distributed import is_lead_worker, setup


def save_checkpoint(args, model):
    if is_lead_worker(args.rank):
        torch.save(model.module.state_dict(), "ckpt.pt")


def main(args, model, rank, world_size):
    setup(rank, world_size)
    model = DDP(model)
    save_checkpoint(args, model)
    agent = Agent(args)
    if agent.is_lead_worker():
        torch.save(model.module.state_dict(), "agent.pt")
