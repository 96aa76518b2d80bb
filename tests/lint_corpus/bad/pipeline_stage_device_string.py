# A pipeline whose stage index is the global rank names its device as f"cuda:{stage}" and
# hands the string on (to build_stage, to a helper): cuda:<global rank> on the second node.
import torch
import torch.distributed as dist
from torch.distributed.pipelining import ScheduleGPipe, pipeline


def make_stage(module, stage_index):
    device = f"cuda:{stage_index}"  # expect: GT018
    return module, device


def main(model, example):
    dist.init_process_group("nccl")
    stage_id = dist.get_rank()
    make_stage(model, stage_id)
    pipe = pipeline(model, mb_args=(example,))
    stage = pipe.build_stage(stage_id, f"cuda:{stage_id}")  # expect: GT018
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=torch.nn.functional.cross_entropy)
    schedule.step(example)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(torch.nn.Linear(2, 2), torch.randn(4, 2))
