# The logger comes from a helper that chooses handlers by rank; the save helper is called
# under the global rank-0 guard.
import os

import torch
import torch.distributed as dist

from logger import create_logger
from utils import save_checkpoint


def main(config):
    for epoch in range(config.EPOCHS):
        logger.info(f"epoch {epoch}")
        model.train()
        loss = model(torch.randn(2, 2)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if dist.get_rank() == 0 and epoch % config.SAVE_FREQ == 0:
            save_checkpoint(config, epoch, model.module, optimizer, logger)
        logger.info(f"epoch {epoch} done")


if __name__ == "__main__":
    config = get_config()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    model = torch.nn.parallel.DistributedDataParallel(build_model().cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=config.LR)
    logger = create_logger(output_dir=config.OUTPUT, dist_rank=dist.get_rank(), name="swin")
    main(config)
    dist.destroy_process_group()
