# Guide: PyTorch Distributed Training: Multi-GPU Guide 2025, "Method 2: Fully Sharded Data
# Parallel (FSDP)" (shared/seeds/004). Verbatim but for the expect markers: a constant LR
# in a data-parallel job (the effective batch grows with the node count), and the GPU index
# taken from the global rank (dist.get_rank() is 4..7 on the second node of 4-GPU nodes).
# It loads the model in bf16 and steps it with torch.optim.AdamW: FSDP keeps the sharded
# parameters in that dtype, so there are no fp32 master weights (GT019).
import torch
from torch.distributed.fsdp import (
    FullyShardedDataParallel as FSDP,
    MixedPrecision,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import AutoModelForCausalLM, AutoTokenizer
import functools

def train_fsdp():
    # Initialize distributed
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)  # expect: GT018
    
    # Load model
    model = AutoModelForCausalLM.from_pretrained(
        "meta-llama/Llama-2-7b-hf",
        torch_dtype=torch.bfloat16,
    )
    
    # FSDP wrapping policy for transformers
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    
    auto_wrap_policy = functools.partial(
        transformer_auto_wrap_policy,
        transformer_layer_cls={LlamaDecoderLayer},
    )
    
    # Mixed precision for efficiency
    mixed_precision = MixedPrecision(
        param_dtype=torch.bfloat16,
        reduce_dtype=torch.bfloat16,
        buffer_dtype=torch.bfloat16,
    )
    
    # Wrap model with FSDP
    model = FSDP(
        model,
        auto_wrap_policy=auto_wrap_policy,
        mixed_precision=mixed_precision,
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        device_id=rank,  # expect: GT018
    )
    
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)  # expect: GT010, GT019
    
    # Training loop (similar to DDP)
    for batch in dataloader:
        optimizer.zero_grad()
        outputs = model(**batch)
        loss = outputs.loss
        loss.backward()
        optimizer.step()
    
    dist.destroy_process_group()
