# Guide: PyTorch Distributed Training Tutorial, "DDP: The Minimal Working Example"
# (shared/seeds/001). Verbatim but for the expect marker. The same guide's "Common DDP
# Pitfalls" names the bug it keeps: "Not scaling the learning rate - the same LR as
# single-GPU training will underfit". It also saves on local_rank == 0, which holds once per
# node: its own multi-node launch (2 nodes x 4 GPUs) has two processes write ckpt_N.pt.
# train.py — run with: torchrun --nproc_per_node=4 train.py
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

def main():
    # Initialise the process group — reads LOCAL_RANK from environment
    dist.init_process_group(backend='nccl')
    local_rank = int(os.environ['LOCAL_RANK'])
    torch.cuda.set_device(local_rank)
    device = torch.device(f'cuda:{local_rank}')

    # Model — wrap in DDP after moving to device
    model = MyModel().to(device)
    model = DDP(model, device_ids=[local_rank])

    # Data — each rank sees a non-overlapping slice
    dataset = MyDataset()
    sampler = DistributedSampler(dataset)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=256, sampler=sampler,
        num_workers=4, pin_memory=True
    )

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # expect: GT010
    criterion = torch.nn.CrossEntropyLoss()

    for epoch in range(50):
        sampler.set_epoch(epoch)   # required for correct shuffling
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()        # gradient all-reduce happens here
            optimizer.step()

        # Only rank 0 saves checkpoints and prints metrics
        if local_rank == 0:
            print(f"Epoch {epoch+1} done")
            torch.save(model.module.state_dict(), f'ckpt_{epoch}.pt')  # expect: GT017

    dist.destroy_process_group()

if __name__ == '__main__':
    import os
    main()
