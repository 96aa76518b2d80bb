# Saves guarded by the node-local rank: `local_rank == 0` holds on one process of every node,
# so on two nodes sharing a filesystem two processes write the same file at once. The
# shapes: the older Hugging Face `local_rank in [-1, 0]`, a trainer's `self.local_rank`, a
# predicate of the project whose body reads LOCAL_RANK, and torchrun's environment variable.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def is_local_leader():
    return int(os.environ["LOCAL_RANK"]) == 0


class Trainer:
    def __init__(self, model):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.model = DDP(model.to(self.local_rank), device_ids=[self.local_rank])

    def train(self, epochs):
        for epoch in range(epochs):
            self.model(torch.ones(2)).sum().backward()
            if self.local_rank == 0 and epoch % 10 == 0:
                torch.save(self.model.module.state_dict(), "snapshot.pt")  # expect: GT017


def main(args):
    dist.init_process_group("nccl")
    torch.cuda.set_device(args.local_rank)
    trainer = Trainer(build_model())
    trainer.train(args.epochs)
    if args.local_rank in [-1, 0]:
        trainer.model.module.save_pretrained(args.output_dir)  # expect: GT017
    if is_local_leader():
        with open(os.path.join(args.output_dir, "results.json"), "w") as f:  # expect: GT017
            f.write("{}")
    if is_local_leader():
        download_dataset("/tmp/cache")  # node-local work: right on local rank 0
        torch.save({"node": os.uname().nodename}, f"/tmp/node_{os.environ['GROUP_RANK']}.pt")
    if dist.get_rank() == 0 and args.local_rank == 0:
        torch.save(trainer.model.module.state_dict(), "final.pt")  # the global rank decides
    dist.destroy_process_group()


if __name__ == "__main__":
    main(parse_args())
