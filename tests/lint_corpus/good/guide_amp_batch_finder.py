# Guide: Mixed-Precision Training (gpu_training), "Memory savings and the batch finder"
# (shared/seeds/000). Verbatim.
from gpu_training.profiling import find_max_batch_size

# `fits(batch)` runs a forward+backward and reports False on CUDA OOM.
best = find_max_batch_size(fits, min_batch=1, max_batch=1024, safety_margin=0.85)
