# fp16 done right with a raw GradScaler (unscale_ before clip), and a scaler that switches
# itself off for bf16.
import torch

DTYPE = torch.float16 if not torch.cuda.is_bf16_supported() else torch.bfloat16
scaler = torch.amp.GradScaler("cuda", enabled=(DTYPE == torch.float16))


def step(model, opt, x, y, max_norm=1.0):
    with torch.autocast("cuda", dtype=DTYPE):
        loss = torch.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return norm
