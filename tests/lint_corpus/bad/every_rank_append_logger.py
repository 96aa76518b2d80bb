# Loggers every rank builds whose file every rank writes (the good twin is
# good/rank0_append_logger.py): a write outside the rank test, and a handle handed to a
# library whose writes nothing here shows.
import logging
import os

import torch
import torch.distributed as dist


class Logger:
    def __init__(self, path):
        self.logout = open(path, "a")  # expect: GT007

    def log_string(self, text):
        if dist.get_rank() == 0:
            print(text)
        self.logout.write(text + "\n")


class StreamLogger:
    def __init__(self, path):
        self.stream = open(path, "a")  # expect: GT007
        self.handler = logging.StreamHandler(self.stream)


def main(output_dir):
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    logger = Logger(os.path.join(output_dir, "log.txt"))
    StreamLogger(os.path.join(output_dir, "events.txt"))
    logger.log_string(f"world size {dist.get_world_size()}")
    dist.destroy_process_group()
