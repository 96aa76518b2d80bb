# The PyTorch ImageNet example's shape: the checkpoint dict (with the DDP wrapper's
# state_dict) goes through a helper that calls torch.save, guarded by "the first GPU of each
# node" (rank % ngpus_per_node == 0) - one writer per node.
import shutil

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main_worker(gpu, ngpus_per_node, args):
    args.rank = args.rank * ngpus_per_node + gpu
    dist.init_process_group(backend="nccl", world_size=args.world_size, rank=args.rank)
    torch.cuda.set_device(gpu)
    model = build_model().cuda(gpu)
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
    optimizer = torch.optim.SGD(model.parameters(), args.lr)
    for epoch in range(args.epochs):
        loss = model(torch.randn(2, 2).cuda(gpu)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if not args.multiprocessing_distributed or args.rank % ngpus_per_node == 0:
            save_checkpoint({"epoch": epoch, "state_dict": model.state_dict()})  # expect: GT006
    dist.destroy_process_group()


def save_checkpoint(state, filename="checkpoint.pth.tar"):
    torch.save(state, filename)  # expect: GT017
    shutil.copyfile(filename, "model_best.pth.tar")  # expect: GT017


if __name__ == "__main__":
    args = parse_args()
    mp.spawn(main_worker, nprocs=args.ngpus, args=(args.ngpus, args))
