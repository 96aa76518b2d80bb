# A DeepSpeed script that checks the rank the launcher gave it and ends with SystemExit on one
# that makes no sense: a raise ends the job, it does not split the ranks, so every rank that
# goes past the check reaches the engine's save_checkpoint (a collective in DeepSpeed).
import deepspeed
import torch.distributed as dist


def main(model, loader, config):
    deepspeed.init_distributed()
    if dist.get_rank() >= dist.get_world_size():
        raise SystemExit(f"bad rank {dist.get_rank()}")
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    for batch in loader:
        loss = engine(batch.to(engine.device))
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint("checkpoints")
    dist.barrier()
    dist.destroy_process_group()
