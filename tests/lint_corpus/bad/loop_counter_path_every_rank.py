# Every rank loops over its own shard but names the files by the loop counter, which starts at
# 0 on every rank: rank 0 and rank 1 both write preds/0.pt, preds/1.pt...
import torch
import torch.distributed as dist


def dump(predictions, out):
    for i, pred in enumerate(predictions):
        torch.save(pred, f"{out}/{i}.pt")  # expect: GT007


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    preds = [torch.zeros(2) for _ in range(rank, 64, world)]
    dump(preds, "preds")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
