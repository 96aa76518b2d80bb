# The toolkit's init without its cleanup.
from gpu_training.ddp import init_distributed, train_one_epoch

ctx = init_distributed()  # expect: GT015
for epoch in range(3):
    train_one_epoch(model, loader, trainer, loss_fn, ctx, epoch=epoch)
