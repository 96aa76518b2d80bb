# Writes that are one file per rank, or written once by the callee: the rank is in the path
# through a name or a parameter two calls up, save_pretrained is told which process is main,
# and to_json() without a path returns text.
import os

import torch
import torch.distributed as dist
from accelerate import Accelerator


class JSONOutputFormat:
    def __init__(self, filename):
        self.file = open(filename, "wt")


def make_output_format(ev_dir, log_suffix=""):
    return JSONOutputFormat(os.path.join(ev_dir, "progress%s.json" % log_suffix))


def configure(ev_dir, log_suffix=""):
    rank = dist.get_rank()
    if rank > 0:
        log_suffix = log_suffix + "-rank%03i" % rank
    return make_output_format(ev_dir, log_suffix)


def main(args):
    accelerator = Accelerator()
    model = accelerator.prepare(build_model())
    configure(args.log_dir)
    global_rank = dist.get_rank()
    save_path = os.path.join(args.out, f"ckpt_epoch.pth.rank{global_rank}")
    torch.save(model.state_dict(), save_path)
    accelerator.unwrap_model(model).save_pretrained(
        args.out, is_main_process=accelerator.is_main_process, save_function=accelerator.save
    )
    frame = build_results()
    accelerator.print(frame.to_json(orient="index"))
    accelerator.end_training()
