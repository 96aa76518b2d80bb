# The main rank adds the learning rate to the metrics dict its step function returned, for the
# log: no param group is touched, and the scheduler steps on every rank (issue 33, set 21).
import torch.distributed as dist


def train(model, loader, optimizer, scheduler, log_every):
    is_main = dist.get_rank() == 0
    for step, batch in enumerate(loader):
        metrics = train_step(model, batch, optimizer)
        scheduler.step()
        if is_main and step % log_every == 0:
            metrics["lr"] = scheduler.get_last_lr()[0]
            metrics["step"] = step
            print(metrics)
