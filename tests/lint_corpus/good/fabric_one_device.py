# A pruning script that keeps Lightning Fabric for its precision handling but asks for one
# device on one node: launch() starts no other process, so its saves are the one process's
# own (issue 33, set 21: Fabric(accelerator="cuda", devices=1) in a repository whose training
# scripts run on several devices).
import os

import lightning as L
import torch


def main(args):
    fabric = L.Fabric(accelerator="cuda", devices=1, precision="32-true")
    fabric.launch()
    model = fabric.setup(build_model())
    for name, module in model.named_modules():
        prune_module(module, args.sparsity)
    os.makedirs(args.out, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(args.out, "pruned.pt"))
    with open(os.path.join(args.out, "sparsity.txt"), "w") as f:
        f.write(str(args.sparsity))


if __name__ == "__main__":
    main(parse_args())
