# Guide: Distributed Training Guide (gpu_training), "Tearing down" (shared/seeds/000).
# Verbatim.
from gpu_training.ddp import cleanup_distributed
cleanup_distributed()   # idempotent; safe to call once on every rank
