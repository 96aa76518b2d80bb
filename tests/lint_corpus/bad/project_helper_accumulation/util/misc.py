# MAE-style helpers: the process group is created here (and destroyed nowhere), and the
# loss scaler runs the backward on every call, stepping only when told to.
import os

import torch
import torch.distributed as dist


def init_distributed_mode(args):
    args.rank = int(os.environ["RANK"])
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    dist.init_process_group(backend="nccl", init_method="env://")


class NativeScalerWithGradNormCount:
    def __init__(self):
        self._scaler = torch.cuda.amp.GradScaler()

    def __call__(self, loss, optimizer, parameters=None, update_grad=True):
        self._scaler.scale(loss).backward()
        if update_grad:
            self._scaler.unscale_(optimizer)
            self._scaler.step(optimizer)
            self._scaler.update()
