# The same written another way: the script branches on `DistributedType.DEEPSPEED`, so its
# Accelerator runs DeepSpeed (fp32 master weights) in the configuration it is launched with.
import torch
from accelerate import Accelerator, DistributedType


def main(cfg, net):
    accelerator = Accelerator()
    net = net.to(torch.bfloat16)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    net, opt = accelerator.prepare(net, opt)
    for x in cfg.loader:
        accelerator.backward(net(x).mean())
        opt.step()
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        state = accelerator.get_state_dict(net)
    else:
        state = accelerator.unwrap_model(net).state_dict()
    accelerator.save(state, "final.pt")
