# Guide: PyTorch Distributed Training Tutorial, "FSDP: Sharding the Model Itself"
# (shared/seeds/001). Verbatim.
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

# Wrap each transformer block independently (not the whole model at once)
auto_wrap_policy = functools.partial(
    transformer_auto_wrap_policy,
    transformer_layer_cls={LlamaDecoderLayer}
)
model = FSDP(model, auto_wrap_policy=auto_wrap_policy, device_id=local_rank)
