# The PyTorch DDP tutorial shape: mp.spawn passes the rank (the GPU index on one node) down
# to a Trainer as gpu_id; `self.gpu_id == 0` is a rank guard because every caller passes a
# rank, and it is not node-local, nor a device taken from torchrun's global RANK.
import torch
import torch.multiprocessing as mp
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, optimizer, gpu_id, save_every):
        self.gpu_id = gpu_id
        self.model = DDP(model.to(gpu_id), device_ids=[gpu_id])
        self.optimizer = optimizer
        self.save_every = save_every

    def _save_checkpoint(self, epoch):
        torch.save(self.model.module.state_dict(), "checkpoint.pt")
        print(f"Epoch {epoch} | Training checkpoint saved")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self.optimizer.zero_grad()
            self.model(torch.randn(2, 20).to(self.gpu_id)).sum().backward()
            self.optimizer.step()
            if self.gpu_id == 0 and epoch % self.save_every == 0:
                self._save_checkpoint(epoch)


def main(rank, world_size, save_every, total_epochs):
    init_process_group(backend="nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3 * world_size)
    trainer = Trainer(model, optimizer, rank, save_every)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    world_size = torch.cuda.device_count()
    mp.spawn(main, args=(world_size, 10, 50), nprocs=world_size)
