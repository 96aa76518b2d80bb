# Accumulation through the helper: the backward all-reduces on every micro-batch.
import torch


def train_one_epoch(model, data_loader, optimizer, loss_scaler, args):
    accum_iter = args.accum_iter
    optimizer.zero_grad()
    for data_iter_step, (samples, _) in enumerate(data_loader):
        with torch.cuda.amp.autocast():
            loss = model(samples)
        loss /= accum_iter
        loss_scaler(loss, optimizer, parameters=model.parameters(),  # expect: GT013
                    update_grad=(data_iter_step + 1) % accum_iter == 0)
        if (data_iter_step + 1) % accum_iter == 0:
            optimizer.zero_grad()
