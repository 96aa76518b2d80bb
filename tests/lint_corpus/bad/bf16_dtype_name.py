# The dtype of the load held in a name (issue 33, round 12): `dtype = torch.bfloat16` and then
# `from_pretrained(..., torch_dtype=dtype)` makes the parameters bf16 just as the literal would;
# raw FSDP without a MixedPrecision policy shards them as they are, and torch's AdamW steps them
# in bf16 with no fp32 master copy.
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoConfig, AutoModelForCausalLM


def train_fsdp(args):
    local_rank = int(os.environ["LOCAL_RANK"])
    dtype = torch.bfloat16
    torch.cuda.set_device(local_rank)
    if dist.get_rank() == 0:
        model = AutoModelForCausalLM.from_pretrained(args.name, torch_dtype=dtype)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.name), torch_dtype=dtype)
    model = FullyShardedDataParallel(model, device_id=local_rank, sync_module_states=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=True)  # expect: GT019
    for batch in args.batches:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()


def train_ddp(args, net):
    half = torch.bfloat16
    net = net.cuda().to(half)
    ddp = DistributedDataParallel(net, device_ids=[int(os.environ["LOCAL_RANK"])])
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)  # expect: GT019
    return opt


def train_keyword(args, encoder):
    precision = torch.bfloat16
    encoder.to(dtype=precision)
    trainable = [p for p in encoder.parameters() if p.requires_grad]
    return torch.optim.AdamW(trainable, lr=args.lr)  # expect: GT019
