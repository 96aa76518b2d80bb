# The same helpers from an Accelerate script: one call guarded, one not.
from accelerate import Accelerator

from common import records


def train(cfg, model, loader, optimizer):
    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if accelerator.is_main_process:
        records.dump_run_config(cfg)
    for batch in loader:
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    records.dump_run_config(cfg)  # expect: GT007
