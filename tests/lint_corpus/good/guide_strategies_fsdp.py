# Guide: Distributed Training Guide: strategies and memory, "FSDP (Fully Sharded Data
# Parallel)" and "FSDP Wrapping Policy" (shared/seeds/002). Verbatim.
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision

mp_policy = MixedPrecision(
    param_dtype=torch.float16,
    reduce_dtype=torch.float16,
    buffer_dtype=torch.float16,
)

model = FSDP(
    model,
    mixed_precision=mp_policy,
    sharding_strategy=ShardingStrategy.FULL_SHARD,
)

from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
import functools

wrap_policy = functools.partial(
    transformer_auto_wrap_policy,
    transformer_layer_cls={TransformerBlock},
)
model = FSDP(model, auto_wrap_policy=wrap_policy)
