# A subclass in another module overrides the epoch loop; the loader it iterates is the one the
# base class built over a shuffling DistributedSampler and hands it from run(): never reseeded.
from base import BaseTrainer


class ReplayTrainer(BaseTrainer):
    def train_task(self, task, dataloader):
        for epoch in range(self.epochs):  # expect: GT005
            for step, (x, y) in enumerate(dataloader):
                loss = (self.model(x) - y).pow(2).mean() * 0.5
                self.model.backward(loss)
                self.model.step()
