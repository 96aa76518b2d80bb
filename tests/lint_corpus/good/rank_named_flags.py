# Names that contain "rank" but are no rank test: a config switch every rank reads alike
# (gather negatives from all ranks or not), and a ranking metric. Every rank takes the same
# branch, so the collectives inside are called by all (issue 33).
import torch
import torch.distributed as dist


class Contrast(torch.nn.Module):
    def __init__(self, negative_all_rank=False, reduce_all_rank: bool = True):
        super().__init__()
        self.negative_all_rank = negative_all_rank
        self.reduce_all_rank = reduce_all_rank

    def forward(self, feats):
        if self.negative_all_rank:
            gathered = [torch.zeros_like(feats) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, feats)
            feats = torch.cat(gathered)
        if self.reduce_all_rank:
            dist.all_reduce(feats)
        return feats
