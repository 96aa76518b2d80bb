# An Accelerate loop that logs the learning rate from the main process: the logs dict is built
# there and gets a 'learning_rate' key; the optimizer's own learning rate is untouched.
from accelerate import Accelerator


def fit(model, optimizer, scheduler, loader):
    accelerator = Accelerator(log_with="tensorboard")
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for step, batch in enumerate(loader):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if accelerator.is_main_process:
            logs = {}
            logs["loss"] = loss.item()
            logs["learning_rate"] = scheduler.get_last_lr()[0]
            accelerator.log(logs, step=step)
    accelerator.end_training()
