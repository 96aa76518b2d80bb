# Micro-batches of one optimizer step, each with its own backward and no no_sync(): every
# backward all-reduces. The second loop is Swin-SimMIM-style: accumulation on one branch
# (flagged), a plain step on every micro-batch on the other (not).
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, loader, optimizer, micro_batches, accum_steps):
    model = DDP(model)
    for batch in loader:
        for chunk in batch.chunk(micro_batches):
            loss = model(chunk).mean() / micro_batches
            loss.backward()  # expect: GT013
        optimizer.step()
        optimizer.zero_grad()
    for idx, batch in enumerate(loader):
        if accum_steps > 1:
            loss = model(batch).mean() / accum_steps
            loss.backward()  # expect: GT013
            if (idx + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
        else:
            optimizer.zero_grad()
            model(batch).mean().backward()
            optimizer.step()


if __name__ == "__main__":
    dist.init_process_group("nccl")
    train(build_model(), build_loader(), build_optimizer(), 4, 2)
    dist.destroy_process_group()
