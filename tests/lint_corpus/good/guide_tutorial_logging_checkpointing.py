# Guide: PyTorch Distributed Training Tutorial, "Logging and Checkpointing in DDP"
# (shared/seeds/001). Verbatim.
rank = dist.get_rank()
world_size = dist.get_world_size()

# Only rank 0 logs
if rank == 0:
    print(f"Loss: {loss.item():.4f}")
    wandb.log({'loss': loss.item()})

# Save the underlying model (not the DDP wrapper)
if rank == 0:
    torch.save(model.module.state_dict(), 'model.pt')

# Loading — load on CPU then move to device
state_dict = torch.load('model.pt', map_location='cpu')
model.module.load_state_dict(state_dict)

# Barrier — wait for rank 0 to finish saving before others proceed
dist.barrier()
