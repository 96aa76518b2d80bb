# The ImageNet example's save guard with the global rank (issue 33 regression): without
# --multiprocessing-distributed the run may still be distributed (launched once per GPU by
# another launcher), and then `not args.multiprocessing_distributed` holds on every process:
# they all write the same file.
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main_worker(gpu, ngpus_per_node, args):
    if args.multiprocessing_distributed:
        args.rank = args.rank * ngpus_per_node + gpu
    dist.init_process_group("nccl", world_size=args.world_size, rank=args.rank)
    torch.cuda.set_device(gpu)
    model = torch.nn.Linear(2, 2).cuda(gpu)
    if not args.multiprocessing_distributed or (
        args.multiprocessing_distributed and args.rank == 0
    ):
        torch.save(model.state_dict(), "checkpoint.pth.tar")  # expect: GT007
    dist.destroy_process_group()


def main(args):
    ngpus_per_node = torch.cuda.device_count()
    if args.multiprocessing_distributed:
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        main_worker(args.gpu, ngpus_per_node, args)
