# A sampling script: no training, but it joins the group, gathers the samples of every rank,
# and never destroys the group either.
import torch
import torch.distributed as dist

from pkg import dist_util


def main():
    dist_util.setup_dist()  # expect: GT015
    samples = sample_batch()
    gathered = [torch.zeros_like(samples) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, samples)
    if dist.get_rank() == 0:
        torch.save(torch.cat(gathered), "samples.pt")


if __name__ == "__main__":
    main()
