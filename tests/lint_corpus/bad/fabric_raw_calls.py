# A Lightning Fabric script: fabric.backward, fabric.print and fabric.save are the right way;
# manual accumulation without no_backward_sync, a raw print and a raw torch.save are not.
import lightning as L
import torch


def main(args):
    fabric = L.Fabric(accelerator="cuda", devices=4, strategy="ddp")
    fabric.launch()
    model, optimizer = fabric.setup(build_model(), torch.optim.AdamW(params(), lr=args.lr))
    loader = fabric.setup_dataloaders(build_loader())
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y) / args.accum
        fabric.backward(loss)  # expect: GT013
        if (step + 1) % args.accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    print("done")  # expect: GT008
    fabric.print("done")
    torch.save(model.state_dict(), "model.pt")  # expect: GT007
    fabric.save("model.ckpt", {"model": model})
