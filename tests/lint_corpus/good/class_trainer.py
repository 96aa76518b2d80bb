# A class-based trainer: rank-0 helpers by early return, a CheckpointManager used by every
# rank in a with block, tqdm disabled off rank 0, per-rank log files, warnings from any rank.
import logging
import sys

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from gpu_training.checkpoint import CheckpointManager
from gpu_training.config import TrainingConfig
from gpu_training.ddp import (
    cleanup_distributed,
    gradient_sync,
    init_distributed,
    make_distributed_sampler,
    reduce_scalar_dict,
    unwrap_model,
)

logger = logging.getLogger(__name__)


class Trainer:
    def __init__(self, model, dataset, cfg: TrainingConfig):
        self.ctx = init_distributed()
        self.model = DistributedDataParallel(model)
        self.sampler = make_distributed_sampler(dataset, self.ctx, shuffle=True)
        self.loader = torch.utils.data.DataLoader(
            dataset, batch_size=cfg.per_device_batch_size, sampler=self.sampler
        )
        self.opt = torch.optim.SGD(self.model.parameters(), lr=cfg.scaled_learning_rate)
        self.accum = cfg.gradient_accumulation_steps
        self.is_main = self.ctx.is_main_process

    def log(self, message):
        if not self.is_main:
            return
        logger.info(message)
        print(message)

    def fit(self, epochs):
        with CheckpointManager("ckpt", ctx=self.ctx) as ckpt:
            for epoch in range(epochs):
                if self.sampler is not None:
                    self.sampler.set_epoch(epoch)
                bar = tqdm(self.loader, disable=not self.is_main)
                for step, (x, y) in enumerate(bar):
                    last = (step + 1) % self.accum == 0
                    with gradient_sync(self.model, enabled=last):
                        loss = torch.nn.functional.mse_loss(self.model(x), y) / self.accum
                        loss.backward()
                    if last:
                        self.opt.step()
                        self.opt.zero_grad()
                metrics = reduce_scalar_dict({"loss": loss.detach()}, self.ctx)
                self.log(f"epoch {epoch}: {metrics['loss']:.4f}")
                ckpt.save({"model_state": unwrap_model(self.model).state_dict()}, step=epoch)
                with open(f"rank{self.ctx.rank}.log", "a") as handle:
                    handle.write(f"{epoch}\n")
                if metrics["loss"] > 1e3:
                    logger.warning("loss diverged on rank %d", self.ctx.rank)

    def close(self):
        try:
            del self.model
        except AttributeError as err:
            print(f"close failed: {err}")
        cleanup_distributed()


if __name__ == "__main__":
    if len(sys.argv) > 2:
        print("usage: class_trainer.py [EPOCHS]", file=sys.stderr)
        sys.exit(2)
