# A bf16 model with torch's AdamW under a plain Accelerator (no DeepSpeed, no FSDP anywhere in
# the script): Accelerate's mixed precision adds autocast and converts nothing, so the bf16
# parameters are stepped with no fp32 master copy.
import torch
from accelerate import Accelerator


def main(cfg, net):
    accelerator = Accelerator(mixed_precision="bf16")
    net = net.to(torch.bfloat16)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr)  # expect: GT019
    net, opt = accelerator.prepare(net, opt)
    for x in cfg.loader:
        accelerator.backward(net(x).mean())
        opt.step()
