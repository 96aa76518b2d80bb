# Guide: Mixed-Precision Training (gpu_training), "fp16 vs bf16: which to use"
# (shared/seeds/000). Verbatim.
from gpu_training.amp import needs_grad_scaler
needs_grad_scaler("fp16")  # True
needs_grad_scaler("bf16")  # False
