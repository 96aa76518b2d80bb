# The loader comes from a factory of the project that builds a shuffling DistributedSampler,
# and the step runs through a model object's method (issue 33, round 12): the `while` loop
# makes a new pass over train_loader each time, and nothing calls set_epoch.
import torch.distributed as dist

import datasets
import engine


def main(cfg, net, opt):
    dist.init_process_group("nccl")
    world, rank = dist.get_world_size(), dist.get_rank()
    for phase, dataset in cfg["datasets"].items():
        if phase == "train":
            train_loader = datasets.make_loader(dataset, phase, world, rank)
        else:
            val_loader = datasets.make_loader(dataset, phase, world, rank)
    runner = engine.Engine(net, opt)
    step = 0
    while step < cfg["steps"]:  # expect: GT005
        for _, batch in enumerate(train_loader):
            step += 1
            runner.step(batch)
            if step % 100 == 0:
                for _, held_out in enumerate(val_loader):
                    runner.net(held_out)
    dist.destroy_process_group()
