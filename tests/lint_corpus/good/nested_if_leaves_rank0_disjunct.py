# Index building: every rank builds the index when there is no cache directory, only rank 0
# when there is one; the write sits under `if cache_dir:`, where only rank 0 got in.
import os

import numpy
import torch.distributed as dist


def build_index(cache_dir, size, cache_hit):
    if not cache_dir or (not cache_hit and dist.get_rank() == 0):
        index = numpy.arange(size)
        if cache_dir:
            os.makedirs(cache_dir, exist_ok=True)
            with open(os.path.join(cache_dir, "desc.txt"), "wt") as writer:
                writer.write(f"{size}\n")
            numpy.save(os.path.join(cache_dir, "index.npy"), index)
        return index
    dist.barrier()
    return numpy.load(os.path.join(cache_dir, "index.npy"))


def main():
    dist.init_process_group("nccl")
    build_index(os.environ.get("CACHE"), 1000, False)
