# A load dtype that a flag picks (bf16 or fp32) and a name bound to fp32: neither is known to
# be bf16, so torch's AdamW is not reported.
import torch
from transformers import AutoModelForCausalLM


def train(args):
    dtype = torch.float32
    if args.bf16:
        dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(args.name, torch_dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss = model(args.batch).loss
    loss.backward()
    optimizer.step()


def train_fp32(args, net):
    kind = torch.float32
    net = net.to(kind)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr)
    loss = net(args.batch).sum()
    loss.backward()
    opt.step()
