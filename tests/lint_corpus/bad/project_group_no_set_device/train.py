import torch

from trainer import Trainer


def main(args, build, loader):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # expect: GT002
    model = build().to(device)
    trainer = Trainer(model, args.local_rank)
    trainer.train(loader, torch.optim.SGD(model.parameters(), lr=args.lr))
