# Collectives that libraries run under the hood, called on the main process only (issue 33):
# the other ranks never join and the job hangs. Accelerate's save_state and
# wait_for_everyone, a DeepSpeed engine's save_checkpoint, and the forward and generate of a
# model sharded with FSDP2's fully_shard (each all-gathers the parameters).
import deepspeed
import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch.distributed.fsdp import fully_shard


def accelerate_main(args):
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(build_model(), build_optimizer())
    if accelerator.is_main_process:
        accelerator.save_state("ckpt")  # expect: GT009
        accelerator.wait_for_everyone()  # expect: GT009


def deepspeed_main(args):
    engine, optimizer, _, _ = deepspeed.initialize(args=args, model=build_model())
    for step, batch in enumerate(build_loader()):
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
        if dist.get_rank() == 0 and step % 100 == 0:
            engine.save_checkpoint("ckpt", tag=step)  # expect: GT009


def fsdp2_main(args):
    dist.init_process_group("nccl")
    torch.cuda.set_device(args.local_rank)
    model = build_model()
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    if dist.get_rank() == 0:
        sample = model.generate(prompt)  # expect: GT009
        logits = model(prompt)  # expect: GT009
    dist.destroy_process_group()
