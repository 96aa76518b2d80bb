from collections import OrderedDict

import torch


def load(model, path):
    state = torch.load(path, map_location="cpu")["net"]
    clean = OrderedDict()
    for key, value in state.items():
        clean[key[7:] if key.startswith("module.") else key] = value
    model.load_state_dict(clean)
    return model
