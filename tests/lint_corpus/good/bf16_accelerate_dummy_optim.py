# A third form: the optimizer falls back to accelerate's DummyOptim when the DeepSpeed config
# names one; the torch AdamW of the other branch is handed to DeepSpeed too.
import torch
from accelerate import Accelerator
from accelerate.utils import DummyOptim


def main(cfg, model, use_ds_optim):
    model = model.bfloat16()
    accelerator = Accelerator(mixed_precision="bf16")
    if use_ds_optim:
        optimizer = DummyOptim(model.parameters(), lr=cfg.lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    model, optimizer = accelerator.prepare(model, optimizer)
    for batch in cfg.loader:
        accelerator.backward(model(batch).sum())
        optimizer.step()
