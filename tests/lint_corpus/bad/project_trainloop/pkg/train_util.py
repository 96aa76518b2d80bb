# The training loop is a class of another module; the script only calls run_loop().
import torch


class TrainLoop:
    def __init__(self, model, data, lr):
        self.model = model
        self.data = data
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def run_loop(self):
        for batch in self.data:
            self.opt.zero_grad()
            self.model(batch).mean().backward()
            self.opt.step()
