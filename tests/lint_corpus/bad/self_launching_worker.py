# A self-launching script whose worker half prints and writes on every rank.
import argparse
import subprocess
import sys

import torch

from gpu_training.ddp import cleanup_distributed, init_distributed, reduce_scalar_dict


def worker(out):
    ctx = init_distributed()
    metrics = reduce_scalar_dict({"loss": torch.tensor(1.0)}, ctx)
    print(f"loss {metrics['loss']}")  # expect: GT008
    with open(out, "w") as handle:  # expect: GT007
        handle.write(str(metrics))
    cleanup_distributed()


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:
        worker("result.txt")
        return 0
    subprocess.run([sys.executable, "-m", "torch.distributed.run", __file__, "--worker"])
    print("launched")
    return 0
