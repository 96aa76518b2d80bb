# A training script that also extracts features (issue 33): the extraction wraps a fresh
# model in DataParallel only so that a checkpoint saved with `module.` keys loads, then
# runs it in eval mode under no_grad in one process. No gradient is ever reduced.
import torch
import torch.nn as nn
from torch.utils.data import DataLoader


def train(model, loader, lr, path):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    torch.save(model.state_dict(), path)


def extract_features(build, dataset, path):
    net = build()
    net = nn.DataParallel(net)
    net.load_state_dict(torch.load(path, weights_only=True))
    net.to("cuda")
    net.eval()
    features = []
    with torch.no_grad():
        for x in DataLoader(dataset, batch_size=1):
            features.append(net(x.cuda()).cpu())
    return torch.cat(features)
