# Objects that exist on the primary rank only (`saver = None`, then set under the guard;
# `best_metric, best_epoch = saver.save_checkpoint(...)`), tested with `is not None`; a flag
# passed down as verbose=is_primary(args); the single-process branch of `if
# args.distributed:`; accumulation with no_sync() around forward and backward.
import logging
import os

import torch

from pkg import utils
from pkg.config import resolve_config

_logger = logging.getLogger("train")


def train_one_epoch(model, loader, optimizer, args):
    accum_steps = args.grad_accum_steps
    has_no_sync = args.distributed and hasattr(model, "no_sync")
    for batch_idx, (x, y) in enumerate(loader):
        need_update = (batch_idx + 1) % accum_steps == 0
        if has_no_sync and not need_update:
            with model.no_sync():
                loss = torch.nn.functional.cross_entropy(model(x), y) / accum_steps
                loss.backward()
        else:
            loss = torch.nn.functional.cross_entropy(model(x), y) / accum_steps
            loss.backward()
        if need_update:
            optimizer.step()
            optimizer.zero_grad()
    return {"loss": loss.item()}


def main(args):
    device = utils.init_distributed_device(args)
    if args.distributed:
        _logger.info(f"Process {args.rank}, total {args.world_size}, device {device}.")
    else:
        _logger.info(f"Training with a single process on 1 device ({device}).")
    config = resolve_config(args, verbose=utils.is_primary(args))
    model = torch.nn.parallel.DistributedDataParallel(build_model().to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    saver = None
    output_dir = None
    best_metric = None
    if utils.is_primary(args):
        output_dir = os.path.join(args.output, args.experiment)
        saver = CheckpointSaver(model, optimizer, checkpoint_dir=output_dir)
        with open(os.path.join(output_dir, "args.yaml"), "w") as f:
            f.write(str(args))
    for epoch in range(args.epochs):
        metrics = train_one_epoch(model, build_loader(args), optimizer, args)
        if output_dir is not None:
            utils.update_summary(epoch, metrics, filename=os.path.join(output_dir, "summary.csv"))
        if saver is not None:
            best_metric, best_epoch = saver.save_checkpoint(epoch, metric=metrics["loss"])
    torch.distributed.destroy_process_group()
    if best_metric is not None:
        _logger.info(f"*** Best metric: {best_metric} (epoch {best_epoch})")


if __name__ == "__main__":
    main(parse_args())
