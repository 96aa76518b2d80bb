# DataParallel imported by name, inside a trainer class; a single-process "multi-GPU" script.
from torch.nn import DataParallel
from torch.nn.parallel import DataParallel as DP


class Runner:
    def __init__(self, net):
        self.net = DataParallel(net).cuda()  # expect: GT001

    def wrap(self, other):
        return DP(other, device_ids=[0, 1])  # expect: GT001
