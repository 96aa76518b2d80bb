# A group whose rank is written into the script (each machine runs its own edited copy, one
# process per machine, over TCP to a fixed host): cuda:0 is that process's only GPU.
import torch
import torch.distributed as dist

if __name__ == "__main__":
    dist.init_process_group("nccl", init_method="tcp://10.0.0.1:12355", rank=0, world_size=2)
    model = torch.nn.Linear(2, 2).to("cuda:0")
    with torch.device("cuda:0"):
        buffer = torch.zeros(4)
    dist.destroy_process_group()
