import torch

from trainer import Trainer, setup_distributed


def main(args, build, loader):
    setup_distributed(args.local_rank)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build().to(device)
    trainer = Trainer(model, args.local_rank)
    trainer.train(loader, torch.optim.SGD(model.parameters(), lr=args.lr))
