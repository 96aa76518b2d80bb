# Guide: Distributed Training Guide: strategies and memory, "Optimization Techniques" and the
# GOOD halves of "Common Memory Leaks" (shared/seeds/002). Verbatim.
config = TrainerConfig(gradient_accumulation_steps=4)

config = TrainerConfig(use_amp=True)

from src.memory_manager import clear_cuda_cache
clear_cuda_cache()

# For HuggingFace models:
model.gradient_checkpointing_enable()

# For custom models:
from torch.utils.checkpoint import checkpoint
out = checkpoint(layer, input, use_reentrant=False)

optimizer.zero_grad(set_to_none=True)  # Frees gradient memory instead of zeroing it

# GOOD — detach and move to CPU
losses = []
for batch in dataloader:
    loss = model(batch)
    losses.append(loss.item())  # .item() returns a Python float

# GOOD — explicitly free it
embeddings = model.encode(text)
predictions = classifier(embeddings)
del embeddings
torch.cuda.empty_cache()

# GOOD — clone to CPU first
writer.add_histogram("weights", model.layer.weight.detach().cpu())

from src.memory_manager import memory_tracking, format_bytes

with memory_tracking(label="training_step") as tracker:
    loss = model(batch)
    loss.backward()
    optimizer.step()

print(f"Step allocated {format_bytes(tracker['allocated_delta'])}")

from src.gpu_monitor import query_nvidia_smi, detect_anomalies

states = query_nvidia_smi()
for s in states:
    print(s.summary_line())

anomalies = detect_anomalies(states)
for a in anomalies:
    print(f"[{a.severity}] {a.message}")
