# The same pruning script on two devices: launch() starts a second process and both write.
import os

import lightning as L
import torch


def main(args):
    fabric = L.Fabric(accelerator="cuda", devices=2, precision="32-true")
    fabric.launch()
    model = fabric.setup(build_model())
    os.makedirs(args.out, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(args.out, "pruned.pt"))  # expect: GT007


if __name__ == "__main__":
    main(parse_args())
