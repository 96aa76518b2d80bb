"""A ``transformers`` model brought by import strings (``model: hf_models:gpt2``).

No ``task: hf``: the user's own factories. The data is the built-in corpus in character
windows (ids below 72, inside the model's 128), as ``(inputs, targets)`` pairs.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.utils.data import Dataset

from gpu_training.tasks.charlm import build_datasets


def gpt2() -> nn.Module:
    """A 1-layer GPT-2 of width 16, from a config (no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=128, n_embd=16, n_layer=1, n_head=2, n_positions=32)
    return GPT2LMHeadModel(config)


def windows() -> tuple[Dataset[Any], Dataset[Any]]:
    """Character windows of 16 of the built-in corpus."""
    data = build_datasets(block_size=16)
    return data.train, data.val
