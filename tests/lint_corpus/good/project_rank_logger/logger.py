# Swin-style logger: the console handler exists on rank 0 only; each rank has its own file.
import logging
import os
import sys


def create_logger(output_dir, dist_rank=0, name=""):
    logger = logging.getLogger(name)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    if dist_rank == 0:
        console = logging.StreamHandler(sys.stdout)
        logger.addHandler(console)
    handler = logging.FileHandler(os.path.join(output_dir, f"log_rank{dist_rank}.txt"), mode="a")
    logger.addHandler(handler)
    return logger
