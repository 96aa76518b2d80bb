# torchrun script that creates an NCCL group but never pins its GPU: .cuda() means cuda:0 on
# every rank.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("nccl")
    model = torch.nn.Linear(8, 8).cuda()  # expect: GT002
    model = DistributedDataParallel(model)
    x = torch.randn(4, 8).cuda()
    model(x).sum().backward()
    dist.destroy_process_group()


main()
