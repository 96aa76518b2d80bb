# A DeepSpeed script that builds its own DataLoader without a DistributedSampler (issue 33):
# deepspeed.initialize sets up the process group, and every rank reads the same batches.
import deepspeed
import torch
from torch.utils.data import DataLoader


def main(args):
    model = build_model()
    engine, optimizer, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters()
    )
    loader = DataLoader(build_dataset(), batch_size=8, shuffle=True)  # expect: GT003
    for epoch in range(3):
        for batch in loader:
            loss = engine(batch)
            engine.backward(loss)
            engine.step()
