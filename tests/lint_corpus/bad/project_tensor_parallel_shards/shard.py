# Hand-written tensor parallelism: each process keeps the slice whose index equals its rank and
# moves it to cuda:<that index>. Inside `if dist.get_rank() == part:` the index *is* the global
# rank, so on a second node the slice goes to a GPU the node does not have.
import os

import torch
import torch.distributed as dist


def split_linear_layers(model, tp_size):
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    for block in model.blocks:
        pieces = torch.chunk(block.proj.weight, tp_size, dim=0)
        for part in range(len(pieces)):
            if dist.get_rank() == part:
                block.proj.weight.data = pieces[part].to(f"{kind}:{part}")  # expect: GT018


def place_stages(stages):
    rank = dist.get_rank()
    for stage_id, stage in enumerate(stages):
        if stage_id != rank:
            continue
        stage.cuda(stage_id)  # expect: GT018


def place_experts(experts, world):
    me = int(os.environ["RANK"])
    for idx, expert in enumerate(experts):
        if idx % world != 0 or idx != me:
            expert.to("meta")
        else:
            expert.to(torch.device("cuda", idx))  # expect: GT018
