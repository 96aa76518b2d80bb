# Past the wrapper in three other spellings: accelerator.unwrap_model(model)(x) in an
# Accelerate script, a policy wrapped as `ddp = DDP(policy)` whose loss comes from
# policy.compute_loss(), and a Fabric model's training_step() called with no
# fabric.mark_forward_method() (each backward is never all-reduced: GT020).
import os

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch.nn.parallel import DistributedDataParallel as DDP


def accelerate_train(model, optimizer, loader):
    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        logits = accelerator.unwrap_model(model)(batch["x"])  # expect: GT020
        loss = torch.nn.functional.cross_entropy(logits, batch["y"])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


def policy_train(policy, batches, optimizer):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    ddp = DDP(policy.cuda(), device_ids=[local_rank])
    ddp.train()
    for batch in batches:
        loss, metrics = policy.compute_loss(batch)  # expect: GT020
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
