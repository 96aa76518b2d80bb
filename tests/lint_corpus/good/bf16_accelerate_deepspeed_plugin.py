# A bf16 model with torch's AdamW under an Accelerator that the launch config puts on DeepSpeed
# (issue 33, round 12): the script reads `accelerator.state.deepspeed_plugin`, so it is written
# for that backend, and DeepSpeed's bf16 mode keeps fp32 master weights of its own.
import torch
from accelerate import Accelerator
from accelerate.utils import DummyScheduler
from transformers import AutoModelForCausalLM, get_scheduler


def main(cfg):
    model = AutoModelForCausalLM.from_pretrained(cfg.path, torch_dtype=torch.bfloat16)
    accelerator = Accelerator(mixed_precision="bf16")
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None or "scheduler" not in plugin.deepspeed_config:
        scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=10, num_training_steps=100)
    else:
        scheduler = DummyScheduler(optimizer, total_num_steps=100, warmup_num_steps=10)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, cfg.loader, scheduler)
    for batch in loader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()
