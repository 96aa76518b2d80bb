"""A reference decoder-only transformer for a :class:`~gpu_training.memory.TransformerShape`.

``gpu-training plan --layers 32 --hidden 4096 ...`` has no model to measure: it measures this
one, built on the ``meta`` device (no memory) and run on fake tensors. ``gpt`` blocks are
nanoGPT's (LayerNorm, GELU MLP, biases, learned positions, tied LM head); ``llama`` blocks
use RMSNorm, a SwiGLU MLP, no biases, grouped-query attention and an untied head.

Example:
    >>> from gpu_training.memory import TransformerShape
    >>> shape = TransformerShape(num_layers=12, hidden_size=768, seq_len=1024)
    >>> model = reference_transformer(shape)
    >>> sum(p.numel() for p in model.parameters()) == shape.num_params()
    True
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gpu_training.memory.budget import TransformerShape
from gpu_training.meta_device import meta_device

__all__ = ["lm_loss", "reference_transformer"]


class _RefBlock(nn.Module):
    def __init__(self, shape: TransformerShape) -> None:
        super().__init__()
        h, llama = shape.hidden_size, shape.arch == "llama"
        norm: Callable[[int], nn.Module] = nn.RMSNorm if llama else nn.LayerNorm
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, shape.head_dim
        self.llama = llama
        kv = 2 * shape.kv_heads * shape.head_dim
        self.ln_1, self.ln_2 = norm(h), norm(h)
        self.qkv = nn.Linear(h, h + kv, bias=not llama)
        self.proj = nn.Linear(h, h, bias=not llama)
        if llama:
            self.gate = nn.Linear(h, shape.ffn, bias=False)
            self.up = nn.Linear(h, shape.ffn, bias=False)
            self.down = nn.Linear(shape.ffn, h, bias=False)
        else:
            self.fc = nn.Linear(h, shape.ffn)
            self.out = nn.Linear(shape.ffn, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        kv = self.kv_heads * self.head_dim
        q, k, v = self.qkv(self.ln_1(x)).split([c, kv, kv], dim=2)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = (z.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2) for z in (k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads
        )
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        h = self.ln_2(x)
        if self.llama:
            return x + self.down(F.silu(self.gate(h)) * self.up(h))
        return x + self.out(F.gelu(self.fc(h)))


class _RefTransformer(nn.Module):
    def __init__(self, shape: TransformerShape, num_layers: int) -> None:
        super().__init__()
        h, llama = shape.hidden_size, shape.arch == "llama"
        self.wte = nn.Embedding(shape.vocab_size, h)
        self.wpe = None if llama else nn.Embedding(shape.seq_len, h)
        self.blocks = nn.ModuleList(_RefBlock(shape) for _ in range(num_layers))
        self.ln_f = nn.RMSNorm(h) if llama else nn.LayerNorm(h)
        self.lm_head = nn.Linear(h, shape.vocab_size, bias=False)
        if not llama:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.lm_head(self.ln_f(x))
        return logits


def reference_transformer(shape: TransformerShape, num_layers: int | None = None) -> nn.Module:
    """A transformer of ``shape`` on the ``meta`` device (structure only, no memory).

    Args:
        shape: The shape.
        num_layers: Build this many blocks instead of ``shape.num_layers``.

    Returns:
        The model; ``model.blocks`` holds the blocks. Its input is ``(batch, seq)`` token ids.

    Example:
        >>> shape = TransformerShape(num_layers=12, hidden_size=768, seq_len=1024)
        >>> model = reference_transformer(shape)
        >>> sum(p.numel() for p in model.parameters()) == shape.num_params()
        True
    """
    with meta_device():
        return _RefTransformer(shape, shape.num_layers if num_layers is None else num_layers)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
