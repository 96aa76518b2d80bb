# As bad/project_sampler_elsewhere, but the epoch loop sets the sampler's epoch
# (issue 33): each epoch reads a new order.
import torch


class Trainer:
    def __init__(self, model, train_loader, optimizer, epochs):
        self.model = model
        self.train_loader = train_loader
        self.optimizer = optimizer
        self.epochs = epochs

    def __call__(self):
        for epoch in range(self.epochs):
            self.train_loader.sampler.set_epoch(epoch)
            self.train_epoch(self.model, self.train_loader, self.optimizer)

    def train_epoch(self, model, batches, optimizer):
        for x, y in batches:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
