# Log files done right: every rank appends to one log (FileHandler's default mode "a": lines
# interleave, nothing is emptied), a "w" log whose name carries the rank, and a Trainer script
# read from torchrun's environment whose own save is guarded by the global main process.
import logging
import os

import torch.distributed as dist
import transformers


def setup_logs(folder):
    rank = dist.get_rank()
    logger = logging.getLogger("train")
    logger.addHandler(logging.FileHandler(os.path.join(folder, "train.log")))
    logger.addHandler(logging.FileHandler(os.path.join(folder, f"debug.{rank}.log"), mode="w"))
    return logger


def finetune(model, data):
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    args = transformers.TrainingArguments(output_dir="out", ddp_find_unused_parameters=world_size == 1)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    if trainer.is_world_process_zero():
        model.save_pretrained("out/final")


if __name__ == "__main__":
    dist.init_process_group("nccl")
    setup_logs("logs")
    finetune(None, None)
    dist.destroy_process_group()
