# Fabric borrowed for its seeding helper and its CSV logger in a one-GPU run: the object is
# never launched nor set up, so the script stays one process and its checkpoint is its own.
from lightning.fabric import Fabric
from lightning.fabric.loggers import CSVLogger
import torch


def run(cfg):
    fab = Fabric(accelerator="cuda", devices=1, loggers=[CSVLogger(cfg.log_dir)])
    fab.seed_everything(cfg.seed)
    net = make_net().cuda()
    opt = torch.optim.SGD(net.parameters(), lr=cfg.lr)
    for batch in make_batches(cfg):
        out = net(batch["x"].cuda())
        loss = out.pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        fab.log_dict({"loss": loss.item()})
    torch.save({"net": net.state_dict()}, cfg.ckpt)
    open(cfg.summary, "w").write("done\n")


if __name__ == "__main__":
    run(parse())
