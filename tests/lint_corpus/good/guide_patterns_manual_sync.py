# Guide: Distributed Training: patterns and synchronisation, "Manual Synchronization" and
# "Communication Patterns" (shared/seeds/003). Verbatim, re-indented.
import torch.distributed as dist

# Get own gradient
local_grad = model[0].weight.grad

# Create tensor to hold reduced gradient
reduced_grad = local_grad.clone()

# All-reduce
dist.all_reduce(reduced_grad, op=dist.ReduceOp.SUM)

# Average
reduced_grad /= torch.distributed.get_world_size()

# Update model
model[0].weight.grad = reduced_grad

dist.all_reduce(tensor, op=dist.ReduceOp.SUM)

# Only process 0 gets result
dist.reduce(tensor, dst=0, op=dist.ReduceOp.SUM)

# Process 0 sends to all
dist.broadcast(tensor, src=0)

# Gather
if rank == 0:
    gathered_list = [torch.zeros_like(tensor) for _ in range(world_size)]
else:
    gathered_list = None

dist.gather(tensor, gather_list=gathered_list, dst=0)

# Scatter
dist.scatter(tensor, scatter_list=scatter_list, src=0)
