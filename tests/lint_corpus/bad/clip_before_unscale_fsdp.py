# A trainer class on FSDP with a GradScaler: the model's own clip_grad_norm_ runs on scaled
# gradients.
import torch


class Trainer:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        self.scaler = torch.amp.GradScaler("cuda")

    def train_step(self, x, y):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.scaler.scale(loss).backward()
        self.model.clip_grad_norm_(1.0)  # expect: GT012
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()
