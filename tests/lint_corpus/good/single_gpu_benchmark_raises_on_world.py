# A DeepSpeed benchmark fixed to one GPU (issue 33, set 12): it raises unless the world size is
# 1, so the shuffled DataLoader after the check only ever runs in one process and needs no
# DistributedSampler.
import deepspeed
import torch.distributed as dist
from torch.utils.data import DataLoader


def main(args):
    model = build_model()
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters()
    )
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    if world_size != 1:
        raise RuntimeError("this benchmark runs on one GPU")
    loader = DataLoader(build_dataset(), batch_size=4, shuffle=True, drop_last=True)
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()


if __name__ == "__main__":
    main(parse_args())
