"""A user task whose targets mask a different number of positions in every sample.

Like instruction data (prompt tokens not scored) or padded documents: sample ``i`` keeps only
its last ``T - (i * 7) % T`` targets; the rest are -100. Used through import strings
(``task: {model: masked_task:model, data: masked_task:data}``) by the invariance tests.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from gpu_training.tasks.charlm import CharLMConfig, CharTransformer, build_datasets

BLOCK = 16


class _Masked(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, base: Any) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.base[index]
        targets = targets.clone()
        hidden = (index * 7) % BLOCK  # 0 .. 15 positions not scored
        targets[:hidden] = -100
        return inputs, targets


_VOCAB = build_datasets(block_size=BLOCK).tokenizer.vocab_size  # at import: not under meta


def model(dropout: float = 0.0) -> nn.Module:
    """A small character transformer (bias-free: see the key-bias note in docs)."""
    shape = CharLMConfig(
        block_size=BLOCK, n_layer=1, n_head=2, n_embd=16, bias=False, dropout=dropout
    )
    return CharTransformer(shape, _VOCAB)


def data() -> tuple[Dataset[Any], Dataset[Any]]:
    """The built-in corpus in windows of 16, with a varying number of masked targets."""
    built = build_datasets(block_size=BLOCK)
    return _Masked(built.train), _Masked(built.val)


def data_small_val() -> tuple[Dataset[Any], Dataset[Any]]:
    """As :func:`data`, with a validation split of 9 samples: 2 ranks hold 5 and 4 of them."""
    train, val = data()
    return train, torch.utils.data.Subset(val, range(9))
