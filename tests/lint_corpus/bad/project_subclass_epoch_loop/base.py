# A continual-learning trainer (issue 33, round 8): one loader per task, each over a shuffling
# DistributedSampler that nobody reseeds. The loop over tasks hands each task's own loader on:
# it is not an epoch loop (a new loader every pass); the epoch loop is in train_task.
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


class BaseTrainer:
    def __init__(self, model, datasets, epochs):
        self.model = model
        self.datasets = datasets
        self.epochs = epochs
        self.loaders = {}

    def build_loaders(self):
        for task, dataset in self.datasets.items():
            sampler = DistributedSampler(dataset)
            self.loaders[task] = DataLoader(dataset, batch_size=8, sampler=sampler)

    def train_task(self, task, dataloader):
        for epoch in range(self.epochs):  # expect: GT005
            for x, y in dataloader:
                loss = (self.model(x) - y).pow(2).mean()
                self.model.backward(loss)
                self.model.step()

    def run(self):
        dist.init_process_group("nccl")
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
        self.build_loaders()
        for task, loader in self.loaders.items():
            self.train_task(task, loader)
        dist.destroy_process_group()
