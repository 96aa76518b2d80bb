# Guide: PyTorch Distributed Training Tutorial, "Monitoring Multi-GPU Training"
# (shared/seeds/001). Verbatim.
import torch.distributed as dist

def log_metrics(loss, rank, world_size):
    """Aggregate loss across all ranks and log from rank 0."""
    loss_tensor = torch.tensor(loss, device='cuda')
    dist.all_reduce(loss_tensor, op=dist.ReduceOp.AVG)
    if rank == 0:
        print(f"Global avg loss: {loss_tensor.item():.4f}")

# In training loop:
log_metrics(loss.item(), local_rank, dist.get_world_size())
