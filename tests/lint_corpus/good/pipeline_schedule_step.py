# A pipeline-parallel step (issue 33, round 8): the first stage hands the schedule its inputs,
# the other stages call step() with none. ScheduleGPipe.step() runs the pipeline's forward and
# backward; it is not an LR scheduler stepped on one rank.
import os

import torch
import torch.distributed as dist
from torch.distributed.pipelining import ScheduleGPipe, pipeline


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    example = torch.randn(8, 4)
    pipe = pipeline(module=model, mb_args=(example,))
    stage = pipe.build_stage(rank, torch.device("cuda", int(os.environ["LOCAL_RANK"])))
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=torch.nn.functional.mse_loss)
    for step in range(10):
        if rank == 0:
            schedule.step(torch.randn(8, 4))
        else:
            schedule.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
