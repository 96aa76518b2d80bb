# nanoGPT's idioms: master_process from the rank, DDP's require_backward_grad_sync switched by
# hand on the last micro-step, raw_model for saving, an LR from the config scaled by the
# world size.
import os

import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="nccl")
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    device = f"cuda:{ddp_local_rank}"
    torch.cuda.set_device(device)
    master_process = ddp_rank == 0
else:
    master_process = True
    ddp_world_size = 1
    device = "cuda"

gradient_accumulation_steps = 8 // ddp_world_size
learning_rate = base_learning_rate * ddp_world_size
model = GPT(config).to(device)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])
raw_model = model.module if ddp else model
optimizer = torch.optim.AdamW(raw_model.parameters(), lr=learning_rate)

for iter_num in range(max_iters):
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        logits, loss = model(*get_batch("train"))
        loss = loss / gradient_accumulation_steps
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if iter_num % 100 == 0 and master_process:
        print(f"iter {iter_num}: loss {loss.item():.4f}")
        torch.save({"model": raw_model.state_dict()}, os.path.join(out_dir, "ckpt.pt"))

if ddp:
    destroy_process_group()
