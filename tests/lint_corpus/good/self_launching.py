# One file, two roles: run without --worker it starts torchrun on itself and reports (the
# parent: one process, free to print and write); with --worker it is a rank.
import argparse
import subprocess
import sys

import torch

from gpu_training.ddp import cleanup_distributed, init_distributed, reduce_scalar_dict


def worker(out):
    ctx = init_distributed()
    metrics = reduce_scalar_dict({"loss": torch.tensor(1.0)}, ctx)
    if ctx.is_main_process:
        with open(out, "w") as handle:
            handle.write(str(metrics))
    cleanup_distributed()


def report(path):
    with open(path) as handle:
        print(handle.read())


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out", default="result.txt")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.out)
        return 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", __file__]
    subprocess.run([*cmd, "--worker", "--out", args.out], check=True)
    report(args.out)
    with open("summary.txt", "w") as handle:
        handle.write("done\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
