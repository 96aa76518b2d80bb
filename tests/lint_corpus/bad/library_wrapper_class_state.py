# A trainer class that keeps what Accelerate's prepare() (or deepspeed.initialize) returned
# on self and saves its state_dict(): the wrapper's keys, "module." on each.
import deepspeed
import torch
from accelerate import Accelerator


class ClassifierTrainer:
    def __init__(self, model, optimizer, loader):
        self.accelerator = Accelerator()
        self.model, self.optimizer, self.loader = self.accelerator.prepare(
            model, optimizer, loader
        )

    def fit(self, epochs: int) -> None:
        for _ in range(epochs):
            self.model.train()
            for x, y in self.loader:
                loss = torch.nn.functional.cross_entropy(self.model(x), y)
                self.accelerator.backward(loss)
                self.optimizer.step()
        if self.accelerator.is_main_process:
            torch.save(self.model.state_dict(), "model.pt")  # expect: GT006


class EngineRunner:
    def __init__(self, args, net):
        self.engine, _, _, _ = deepspeed.initialize(
            args=args, model=net, model_parameters=net.parameters()
        )

    def save(self) -> None:
        torch.save({"model": self.engine.state_dict()}, "engine.pt")  # expect: GT006
