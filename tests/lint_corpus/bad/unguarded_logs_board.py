# TensorBoard from every rank, and a guard that only covers half the logging.
from torch.utils.tensorboard import SummaryWriter

from gpu_training.ddp import cleanup_distributed, init_distributed, reduce_scalar_dict

ctx = init_distributed()
writer = SummaryWriter("runs/demo")  # expect: GT008
metrics = reduce_scalar_dict({"loss": 0.5}, ctx)
if ctx.is_main_process:
    print(f"loss {metrics['loss']:.3f}")
writer.add_scalar("loss", metrics["loss"], 0)  # expect: GT008
cleanup_distributed()
