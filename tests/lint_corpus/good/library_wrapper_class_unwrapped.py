# The same trainer class saving the unwrapped model, and one that unwraps on self.
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
            torch.save(
                self.accelerator.unwrap_model(self.model).state_dict(), "model.pt"
            )
            torch.save(self.optimizer.state_dict(), "optimizer.pt")


class UnwrappingTrainer:
    def __init__(self, model, loader):
        self.accelerator = Accelerator()
        self.model, self.loader = self.accelerator.prepare(model, loader)

    def finish(self) -> None:
        self.model = self.accelerator.unwrap_model(self.model)
        self.model.eval()
        if self.accelerator.is_main_process:
            torch.save(self.model.state_dict(), "final.pt")
