# Idioms of the older Hugging Face example scripts: local_rank -1 means "not distributed",
# rank 0 downloads first while the others wait at a barrier, the log level silences the
# other ranks, and evaluation loaders are not sharded. (Those scripts saved under
# `local_rank in [-1, 0]`, once per node: that shape is bad/node_local_saves.py; here the
# save is guarded by the global rank.)
import logging

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

logger = logging.getLogger(__name__)


def main(args):
    if args.local_rank != -1:
        torch.cuda.set_device(args.local_rank)
        torch.distributed.init_process_group(backend="nccl")
    logging.basicConfig(level=logging.INFO if args.local_rank in [-1, 0] else logging.WARN)
    logger.info("Process rank: %s, device: %s", args.local_rank, args.device)

    if args.local_rank not in [-1, 0]:
        torch.distributed.barrier()  # the others wait while rank 0 downloads
    model = load_pretrained(args.model_name)
    if args.local_rank == 0:
        torch.distributed.barrier()  # rank 0 releases them

    sampler = RandomSampler(train_set) if args.local_rank == -1 else DistributedSampler(train_set)
    train_dataloader = DataLoader(train_set, sampler=sampler, batch_size=args.batch_size)
    eval_dataloader = DataLoader(eval_set, sampler=SequentialSampler(eval_set), batch_size=64)
    model = DDP(model, device_ids=[args.local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for batch in train_dataloader:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        logger.info("epoch %d done", epoch)
        if args.local_rank == -1 or torch.distributed.get_rank() == 0:
            model.module.save_pretrained(args.output_dir)
    torch.distributed.destroy_process_group()
