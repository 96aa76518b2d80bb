# Fabric done its own way: no_backward_sync() around forward and backward of the micro-batches
# that do not step, fabric.print, fabric.save, a raw write under is_global_zero.
import lightning as L
import torch


def main(args):
    fabric = L.Fabric(accelerator="cuda", devices=4, strategy="ddp")
    fabric.launch()
    model, optimizer = fabric.setup(build_model(), build_optimizer())
    loader = fabric.setup_dataloaders(build_loader())
    for step, (x, y) in enumerate(loader):
        is_accumulating = (step + 1) % args.accum != 0
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            loss = torch.nn.functional.cross_entropy(model(x), y) / args.accum
            fabric.backward(loss)
        if not is_accumulating:
            optimizer.step()
            optimizer.zero_grad()
        fabric.print(f"step {step}")
    fabric.save("model.ckpt", {"model": model})
    if fabric.is_global_zero:
        torch.save({"steps": step}, "meta.pt")
