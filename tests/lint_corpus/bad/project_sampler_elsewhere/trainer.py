# The epoch loop lives here; the shuffling DistributedSampler is built in main.py, and
# nothing sets its epoch (issue 33): every epoch reads the same order.
import torch


class Trainer:
    def __init__(self, model, train_loader, optimizer, epochs):
        self.model = model
        self.train_loader = train_loader
        self.optimizer = optimizer
        self.epochs = epochs

    def __call__(self):
        for epoch in range(self.epochs):  # expect: GT005
            self.train_epoch(self.model, self.train_loader, self.optimizer)

    def train_epoch(self, model, batches, optimizer):
        for x, y in batches:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
