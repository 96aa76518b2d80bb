# Distributed samplers where a reader of one line would not see them: chosen in an if/else,
# passed through **kwargs, built in a helper, or inside a loader a helper returns.
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler


def build_sampler(dataset):
    return DistributedSampler(dataset, shuffle=True)


def build_loader(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, sampler=DistributedSampler(dataset))


def main(args):
    dist.init_process_group("nccl")
    torch.cuda.set_device(args.local_rank)
    model = torch.nn.parallel.DistributedDataParallel(build_model().cuda())
    dataset = build_dataset()
    if args.distributed:
        sampler_train = DistributedSampler(dataset)
    else:
        sampler_train = RandomSampler(dataset)
    loaders = [DataLoader(dataset, sampler=sampler_train, batch_size=8)]
    train_kwargs = {"batch_size": 8, "sampler": DistributedSampler(dataset)}
    loaders.append(DataLoader(dataset, **train_kwargs))
    loaders.append(DataLoader(dataset, batch_size=8, sampler=build_sampler(dataset)))
    loaders.append(build_loader(dataset, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        for loader in loaders:
            loader.sampler.set_epoch(epoch)
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
    dist.destroy_process_group()
