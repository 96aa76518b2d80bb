# A process group that is never destroyed: raw torch, and the toolkit without
# cleanup_distributed().
import torch
import torch.distributed as dist


def main():
    dist.init_process_group(backend="gloo")  # expect: GT015
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
    model(torch.ones(1, 2)).sum().backward()


if __name__ == "__main__":
    main()
