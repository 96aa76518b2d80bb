import torch
from accelerate import Accelerator
from logsetup import start_log

accelerator = Accelerator()
out = "runs/latest/"
if accelerator.is_local_main_process:
    log = start_log(out)  # expect: GT017

model = torch.nn.Linear(4, 4)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3 * accelerator.num_processes)
model, optimizer = accelerator.prepare(model, optimizer)
for step in range(10):
    loss = model(torch.randn(2, 4)).sum()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
accelerator.end_training()
