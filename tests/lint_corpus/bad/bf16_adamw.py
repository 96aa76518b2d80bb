# The module converted to bf16 and handed to torch.optim.AdamW (issue 33): no fp32 master
# weights, so updates below bf16's resolution round away. The autocast variant below it (fp32
# parameters, bf16 compute) is right. The script runs distributed (a process group); the same
# code in a single-process script is out of the linter's scope (good/bf16_one_process.py).
import os

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM


def setup():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")


def teardown():
    dist.destroy_process_group()


def train_converted(args):
    model = build_model().cuda().to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)  # expect: GT019
    return model, optimizer


def train_pretrained(args):
    model = AutoModelForCausalLM.from_pretrained(args.name, torch_dtype=torch.bfloat16)
    groups = [{"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": 0.1}]
    optimizer = torch.optim.Adam(groups, lr=args.lr)  # expect: GT019
    optimizer = torch.optim.AdamW(  # expect: GT019
        [p for p in model.parameters() if p.requires_grad], lr=args.lr
    )
    return model, optimizer


def train_in_place(args):
    model = build_model().cuda()
    model.bfloat16()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)  # expect: GT019
    return model, optimizer


def train_autocast(args):
    model = build_model().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss = model(torch.randn(2, 2).cuda()).sum()
    loss.backward()
    optimizer.step()


def train_cast_back(args):
    model = build_model().cuda().to(torch.bfloat16)
    model.float()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    return model, optimizer
