# Guide: Distributed Training: patterns and synchronisation, "Launch Across Multiple Machines"
# (shared/seeds/003). Verbatim, re-indented.
import argparse
import os

def setup_ddp_multinode(rank, world_size, master_addr, master_port):
    """Setup multi-node DDP."""
    os.environ['MASTER_ADDR'] = master_addr
    os.environ['MASTER_PORT'] = str(master_port)

    dist.init_process_group(
        backend='nccl',
        rank=rank,
        world_size=world_size,
        timeout=timedelta(minutes=30),
    )

if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    parser.add_argument('--rank', type=int)
    parser.add_argument('--world_size', type=int)
    parser.add_argument('--master_addr', type=str)
    parser.add_argument('--master_port', type=int, default=29500)
    args = parser.parse_args()

    setup_ddp_multinode(args.rank, args.world_size,
                        args.master_addr, args.master_port)

    # Training code
    model = nn.Linear(10, 5).cuda(args.rank)
    model = DDP(model, device_ids=[args.rank])

    #... training loop...
