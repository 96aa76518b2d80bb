# Toolkit script: the CheckpointManager is right, but a hand-written export is not guarded.
import torch

from gpu_training.checkpoint import CheckpointManager
from gpu_training.ddp import cleanup_distributed, init_distributed, unwrap_model

ctx = init_distributed()
ckpt = CheckpointManager("checkpoints", ctx=ctx)
ckpt.save({"model_state": unwrap_model(model).state_dict()}, step=10)
torch.save(unwrap_model(model).state_dict(), "export/model.pt")  # expect: GT007
cleanup_distributed()
