# Guide: Distributed Training: patterns and synchronisation, "Debugging DDP"
# (shared/seeds/003). Verbatim, re-indented.
if dist.is_available() and dist.is_initialized():
    print(f"Rank: {dist.get_rank()}")
    print(f"World size: {dist.get_world_size()}")
    print(f"Backend: {dist.get_backend()}")

# Set timeout to detect hangs
dist.init_process_group(
    backend='nccl',
    timeout=timedelta(minutes=30),
)

# Hangs will raise exception after 30 minutes

# Check gradients match across processes
if dist.is_initialized():
    all_grads = []
    for param in model.parameters():
        local_grad = param.grad.clone()
        gathered = [torch.zeros_like(local_grad) for _ in range(world_size)]
        dist.all_gather(gathered, local_grad)
        all_grads.append(gathered)

    # Verify all ranks have identical gradients
    for rank in range(1, world_size):
        for i, grads in enumerate(all_grads):
            assert torch.allclose(grads[0], grads[rank])
