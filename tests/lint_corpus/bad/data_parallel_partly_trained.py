# DataParallel wrappers that do train (the good twin is
# good/data_parallel_feature_extraction.py): one fine-tuned after loading, one called
# outside no_grad and handed to a helper of its own.
import torch
import torch.nn as nn


def finetune(build, loader, lr, path):
    net = nn.DataParallel(build())  # expect: GT001
    net.load_state_dict(torch.load(path, weights_only=True))
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()


def score(build, loader, helper):
    net = nn.DataParallel(build())  # expect: GT001
    net.eval()
    with torch.no_grad():
        first = [net(x) for x, _ in loader]
    helper(net, loader)
    return first
