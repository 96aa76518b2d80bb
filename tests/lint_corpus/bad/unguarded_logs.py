# Printing, logging, progress bars and metric uploads from every rank.
import logging

import torch.distributed as dist
import wandb
from tqdm import tqdm

log = logging.getLogger(__name__)


def run(model, loader, opt):
    dist.init_process_group("gloo")
    wandb.init(project="demo")  # expect: GT008
    for step, (x, y) in enumerate(tqdm(loader)):  # expect: GT008
        loss = model(x, y)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.3f}")  # expect: GT008
        log.info("step %d", step)  # expect: GT008
        wandb.log({"loss": loss.item()})  # expect: GT008
    dist.destroy_process_group()
