# The model shards itself in a method (FSDP2's fully_shard on a device mesh, which also sets
# up the process group) that main() calls through an instance built by a factory and moved
# with .to(): main() runs on every rank, so its unguarded torch.save writes the same file
# from every process.
import os

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def shard(self, world_size):
        mesh = init_device_mesh("cuda", (world_size,))
        for layer in self.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self, mesh=mesh)


def build_model():
    return Net()


def main():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = build_model().to("cuda")
    model.shard(int(os.environ["WORLD_SIZE"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # expect: GT010
    loader = DataLoader(range(8), shuffle=True)  # expect: GT003
    for x in loader:
        model(x).sum().backward()
        optimizer.step()
    torch.save(model.state_dict(), "model.pt")  # expect: GT007


if __name__ == "__main__":
    main()
