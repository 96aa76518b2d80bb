# Guide: Distributed Training Guide (gpu_training), "Logging metrics across ranks"
# (shared/seeds/000). Verbatim.
from gpu_training.ddp import reduce_scalar_dict

reduced = reduce_scalar_dict({"loss": local_loss}, ctx, average=True)
if ctx.is_main_process:
    print(f"global loss = {reduced['loss']:.4f}")
