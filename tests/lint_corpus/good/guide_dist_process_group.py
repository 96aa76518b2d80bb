# Guide: Distributed Training Guide (gpu_training), "The process group mental model"
# (shared/seeds/000). Verbatim.
from gpu_training.ddp import init_distributed, resolve_device

ctx = init_distributed(backend="nccl")   # nccl for GPUs, gloo for CPU
device = resolve_device(ctx)             # cuda:<local_rank>
