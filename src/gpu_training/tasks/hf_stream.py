"""The Hugging Face task's training stream: each record tokenized on the fly into one window.

``task_options.stream`` trains ``task: hf`` on a :class:`~gpu_training.streaming.SampleStream`
(:func:`~gpu_training.tasks.streams.open_stream`) instead of a token cache: nothing is
tokenized ahead of time, and each rank (or DataLoader worker) tokenizes only its own records.

**One window per record, not packed.** Record ``i`` of the stream is sample ``i``: its tokens
(``BOS`` when the tokenizer has a distinct one, the text, ``EOS``) cut to ``block_size + 1``,
inputs and targets shifted by one; a shorter record is padded and its padding not scored
(targets ``IGNORE_INDEX``; causal attention keeps the padding out of the scored positions).
Packing across records, or cutting a long record into several windows, would make where
window ``k`` starts depend on the token counts of every record before it: reopening the
stream at the toolkit's global cursor would then tokenize the whole prefix on every rank, and
each rank would tokenize every record rather than its own. Per record, the global cursor
is a record index, so a resume at any world size reopens it by skipping raw records, and a
window's id is its record's index. The price: a record longer than the window is truncated and
a short one pads; give records of about ``block_size`` tokens (or use ``train_files``, packed).

Example:
    >>> class Chars:  # a stand-in tokenizer: a character is its code point
    ...     bos_token_id, eos_token_id = None, 0
    ...     def __call__(self, text, add_special_tokens=False):
    ...         return {"input_ids": [ord(c) for c in text]}
    >>> inputs, targets = TokenWindow(Chars(), block_size=4)("ab")
    >>> inputs.tolist(), targets.tolist()
    ([97, 98, 0, 0], [98, 0, -100, -100])
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gpu_training.config import ConfigError
from gpu_training.tasks.losses import IGNORE_INDEX
from gpu_training.tasks.streams import FileStream, HFStream, open_stream

__all__ = ["TokenWindow", "hf_stream"]


class TokenWindow:
    """A record's text as one ``(inputs, targets)`` window of ``block_size`` tokens.

    The same document rule as the token cache (:mod:`gpu_training.tasks.hf_data`): ``BOS``
    (when distinct from ``EOS``), the text without special tokens, ``EOS``. A class, not a
    closure: DataLoader workers pickle it, with the tokenizer.

    Args:
        tokenizer: The model's tokenizer (a ``transformers`` tokenizer, or any callable
            returning ``{"input_ids": [...]}``) with an ``eos_token_id``.
        block_size: Tokens per sample.

    Raises:
        ConfigError: If the tokenizer has no EOS token.
    """

    def __init__(self, tokenizer: Any, block_size: int) -> None:
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ConfigError(
                "the tokenizer has no EOS token: a record's end could not be marked; use a "
                "tokenizer with an eos_token"
            )
        bos = tokenizer.bos_token_id
        self.tokenizer, self.block_size, self.eos = tokenizer, block_size, int(eos)
        self.start = [int(bos)] if bos is not None and bos != eos else []

    def __call__(self, text: str) -> tuple[Tensor, Tensor]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        window = [*self.start, *ids, self.eos][: self.block_size + 1]
        n = len(window) - 1  # positions with a next token to score
        # padding: EOS as input (never attended to by a scored position), targets not scored
        inputs = torch.full((self.block_size,), self.eos, dtype=torch.long)
        targets = torch.full((self.block_size,), IGNORE_INDEX, dtype=torch.long)
        if n > 0:
            inputs[:n] = torch.tensor(window[:-1], dtype=torch.long)
            targets[:n] = torch.tensor(window[1:], dtype=torch.long)
        return inputs, targets


def hf_stream(
    path: str, tokenizer: Any, block_size: int, *, reader: str, text_field: str
) -> FileStream | HFStream:
    """``task: hf``'s training stream over ``path``: one :class:`TokenWindow` per record.

    Args:
        path: A ``.jsonl``/``.txt``/``.parquet`` file or a directory of them.
        tokenizer: The model's tokenizer.
        block_size: Tokens per sample.
        reader: ``files`` or ``hf`` (``datasets`` streaming).
        text_field: JSONL/Parquet: the field holding a record's text.

    Raises:
        ConfigError: If the path holds no data file or the tokenizer has no EOS token.
    """
    encode = TokenWindow(tokenizer, block_size)
    return open_stream(path, encode, reader=reader, text_field=text_field)
