# A trainer whose saves return early unless `self.local_master`, set from the config's
# local rank (True when not distributed) (issue 33, round 6): one writer per node, GT017, not
# a write on every rank.
import torch
import torch.distributed as dist


class Trainer:
    def __init__(self, model, optimizer, config, checkpoint_dir):
        self.model = model
        self.optimizer = optimizer
        self.checkpoint_dir = checkpoint_dir
        if config["distributed"]:
            self.local_master = config["local_rank"] == 0
        else:
            self.local_master = True

    def train(self, loader, epochs):
        for epoch in range(epochs):
            for x, y in loader:
                self.optimizer.zero_grad()
                torch.nn.functional.mse_loss(self.model(x), y).backward()
                self.optimizer.step()
            self._save_checkpoint(epoch)

    def _save_checkpoint(self, epoch):
        # only the local master saves
        if not self.local_master:
            return
        state = {"epoch": epoch, "state_dict": self.model.module.state_dict()}
        path = f"{self.checkpoint_dir}/checkpoint-epoch{epoch}.pth"
        torch.save(state, path)  # expect: GT017


def main(config, model, loader, lr):
    dist.init_process_group("nccl")
    torch.cuda.set_device(config["local_rank"])
    model = torch.nn.parallel.DistributedDataParallel(model.cuda())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * dist.get_world_size())
    trainer = Trainer(model, optimizer, config, "saved")
    trainer.train(loader, 3)
    dist.destroy_process_group()
