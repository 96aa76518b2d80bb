import torch


def describe(state):
    return {name.replace("module.", ""): tuple(t.shape) for name, t in state.items()}


def restore(model, path):
    state = torch.load(path, map_location="cpu")
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in state.items()})
    return model
