# An evaluation helper with the script's own switch (issue 33, round 7): the sharded path moves
# each batch to the rank's GPU, the other path to "cuda:0". That one runs in one process, so
# its fixed index is no GPU shared by ranks, though no branch here creates the group.
import torch
import torch.distributed as dist


def evaluation(model, loader, cfg, local_rank):
    total = 0.0
    for batch in loader:
        if cfg.enable_fsdp:
            batch = batch.to(local_rank)
        else:
            batch = batch.to("cuda:0")
        with torch.no_grad():
            total += model(batch).sum()
    if cfg.enable_fsdp:
        dist.all_reduce(total)
    return total
