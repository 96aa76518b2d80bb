# Rank 0 alone enters FSDP.summon_full_params, which all-gathers every parameter from every
# rank: the others never join and rank 0 hangs. The early return of the other ranks at the
# top of a helper is the rank guard (issue 33, set 10's generation test of an FSDP model).
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy


def is_master():
    return not dist.is_initialized() or dist.get_rank() == 0


def sample_text(model, tokenizer, prompts):
    if not is_master():
        return
    with FSDP.summon_full_params(model, writeback=False):  # expect: GT009
        for prompt in prompts:
            ids = torch.tensor([tokenizer.encode(prompt)]).cuda()
            print(tokenizer.decode(model(ids).argmax(-1)[0].tolist()))


def export_weights(sharded, path):
    # the same all-gather, written as a method call on the wrapper, under an explicit test
    if int(os.environ["RANK"]) == 0:
        with sharded.summon_full_params(sharded, rank0_only=False):  # expect: GT009
            torch.save({k: v.cpu() for k, v in sharded.named_parameters()}, path)


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = FSDP(build_model().cuda(), auto_wrap_policy=transformer_auto_wrap_policy)
    train(model)
    sample_text(model, build_tokenizer(), ["Once upon a time"])
    export_weights(model, "weights.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
