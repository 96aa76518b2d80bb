# Data-parallel evaluation (issue 33, set 11): each rank takes the samples range(rank, n, world)
# and a helper writes one directory per sample index, so no two ranks write the same file. The
# loop counter (the same on every rank) is not in the paths.
import json
from pathlib import Path

import torch
import torch.distributed as dist


def run_eval(data, my_indices, output_dir, rank):
    for count, idx in enumerate(my_indices):
        sample_dir = Path(output_dir) / f"{idx:06d}"
        sample_dir.mkdir(parents=True, exist_ok=True)
        torch.save(torch.tensor(data[idx]), str(sample_dir / "latents.pt"))
        print(f"[rank {rank}] {count + 1}/{len(my_indices)}")


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = list(range(64))
    run_eval(data, list(range(rank, len(data), world)), "eval_out", rank)
    dist.destroy_process_group()


def shard_and_dump(records, out):
    """The same with the shard sliced, and with zip: each record is this rank's."""
    rank = dist.get_rank()
    mine = records[rank :: dist.get_world_size()]
    for record, score in zip(mine, range(len(mine))):
        with open(Path(out) / f"{record['id']}.json", "w") as f:
            json.dump({"score": score}, f)


if __name__ == "__main__":
    main()
