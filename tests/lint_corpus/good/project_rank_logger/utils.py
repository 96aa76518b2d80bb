# A checkpoint helper that writes unguarded: its only caller guards it.
import os

import torch


def save_checkpoint(config, epoch, model, optimizer, logger):
    save_state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    save_path = os.path.join(config.OUTPUT, f"ckpt_epoch_{epoch}.pth")
    logger.info(f"{save_path} saving......")
    torch.save(save_state, save_path)
