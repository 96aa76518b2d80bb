# Clipping with and without a GradScaler. The scaled branch clips the scaled gradients
# (no unscale_ first): a bug. The `else:` runs only when there is no scaler, so nothing
# there is scaled and its clip is right (issue 33).
import torch


def step(model, loss, opt, scaler, max_norm):
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    if scaler is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # expect: GT012
        scaler.step(opt)
        scaler.update()
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
    opt.zero_grad()
