# FSDP trainer class: a ShardedGradScaler kept from an fp16 recipe after switching to bf16.
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler


class Trainer:
    def __init__(self, model):
        self.model = FSDP(model)
        self.scaler = ShardedGradScaler()  # expect: GT011

    def step(self, batch, opt):
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = self.model(batch)
        self.scaler.scale(loss).backward()
        self.scaler.step(opt)
        self.scaler.update()
