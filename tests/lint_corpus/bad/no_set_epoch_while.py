# The toolkit's sampler, a while loop over epochs and enumerate() over the loader: still no
# set_epoch.
from torch.utils.data import DataLoader

from gpu_training.ddp import make_distributed_sampler

sampler = make_distributed_sampler(dataset, ctx, shuffle=True, seed=0)
train_loader = DataLoader(dataset, batch_size=16, sampler=sampler, shuffle=sampler is None)
epoch = 0
while epoch < 3:  # expect: GT005
    for step, batch in enumerate(train_loader):
        train_step(batch)
    epoch += 1
