# Rank guards spelled the ways real scripts spell them, each recognised by what it computes:
# `not args.rank`, a local flag, `x if rank == 0 else None` and a None test on it, a
# predicate whose body compares the rank with 0, and an early return in a helper.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.tensorboard import SummaryWriter


def is_master():
    return not dist.is_initialized() or dist.get_rank() == 0


def log(message):
    if not is_master():
        return
    print(message)


def main(args):
    dist.init_process_group("nccl")
    torch.cuda.set_device(args.local_rank)
    args.rank = dist.get_rank()
    main_process = args.rank == 0
    writer = SummaryWriter(args.log_dir) if args.rank == 0 else None
    model = DDP(build_model().cuda())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        loss = model(torch.randn(4, 8).cuda()).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if writer is not None:
            writer.add_scalar("loss", loss.item(), step)
        if main_process:
            print(f"step {step}")
        if not args.rank:
            torch.save(model.module.state_dict(), "last.pt")
        log(f"step {step} done")
        if is_master():
            with open("progress.txt", "a") as f:
                f.write(f"{step}\n")
    if writer:
        writer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(parse_args())
