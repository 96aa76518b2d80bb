# `if args.dry_run or is_main:` then `if not args.dry_run:` — past the dry-run operand, only
# the main process is left to save the checkpoint.
import torch
import torch.distributed as dist


def finish(args, model):
    is_main = dist.get_rank() == 0
    if args.dry_run or is_main:
        if not args.dry_run:
            torch.save(model.module.state_dict(), args.out)


def main(args):
    dist.init_process_group("nccl")
    torch.cuda.set_device(args.local_rank)
    model = torch.nn.parallel.DistributedDataParallel(build().cuda())
    finish(args, model)
