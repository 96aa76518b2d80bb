# Manual gradient accumulation under an Accelerator built with an FSDP plugin: the model is
# FSDP, not DDP, and reduce-scatters each micro-batch's gradients by design (no_sync would keep
# full unsharded gradients on every rank), so this is not GT013's DDP all-reduce per
# micro-batch (set 8's convention for FSDP).
from accelerate import Accelerator, FullyShardedDataParallelPlugin


def train(model, optimizer, loader, accumulation_steps=4):
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for step, batch in enumerate(loader):
        loss = model(**batch).loss / accumulation_steps
        accelerator.backward(loss)
        if (step + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    accelerator.wait_for_everyone()
    state = accelerator.get_state_dict(model)
    accelerator.unwrap_model(model).save_pretrained(
        "out", is_main_process=accelerator.is_main_process, state_dict=state
    )
