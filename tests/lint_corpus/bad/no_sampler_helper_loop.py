# A training DataLoader with no sampler, iterated in a helper that trains (issue 33): the
# batches reach a backward through the helper, so every rank trains on the same data. A
# second one feeds a library's step, which nobody here can read: it may train, reported.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from trainlib import fit_batch


def run_epoch(model, batches, optimizer):
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def evaluate(model, batches):
    with torch.no_grad():
        return sum(float(model(x).mean()) for x, _ in batches)


def main(dataset, eval_dataset):
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    loader = DataLoader(dataset, batch_size=8, shuffle=True)  # expect: GT003
    checks = DataLoader(eval_dataset, batch_size=8)
    for epoch in range(3):
        run_epoch(model, loader, optimizer)
        evaluate(model, checks)
    extra = DataLoader(dataset, batch_size=8, shuffle=True)  # expect: GT003
    for batch in extra:
        fit_batch(model, batch)
    dist.destroy_process_group()
