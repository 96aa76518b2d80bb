# A training loader measured with len() for a scheduler, then trained on with no sampler
# (issue 33, round 10): len() does not make it an evaluation loader.
import deepspeed
import torch
from torch.utils.data import DataLoader


def main(args, model, train_set):
    deepspeed.init_distributed()
    loader = DataLoader(train_set, batch_size=8, shuffle=True)  # expect: GT003
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters()
    )
    steps = len(loader) * args.epochs
    scheduler = torch.optim.lr_scheduler.LinearLR(engine.optimizer, total_iters=steps)
    for _ in range(args.epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            scheduler.step()
    torch.distributed.destroy_process_group()
