# Guide: Distributed Training Guide (gpu_training), "Sharding data correctly"
# (shared/seeds/000). Verbatim.
from gpu_training.ddp import make_distributed_sampler

sampler = make_distributed_sampler(dataset, ctx, shuffle=True, seed=42)
loader = DataLoader(dataset, batch_size=cfg.per_device_batch_size,
                    sampler=sampler, shuffle=(sampler is None))
