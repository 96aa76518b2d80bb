# A stand-alone deploy script strips `module.` for itself; the training script neither imports
# it nor strips, so its own resume path (and any other consumer) meets the prefixed keys.
import torch

if __name__ == "__main__":
    net = torch.nn.Linear(4, 1)
    state = torch.load("final.pt", map_location="cpu")
    net.load_state_dict({k[7:] if k.startswith("module.") else k: v for k, v in state.items()})
