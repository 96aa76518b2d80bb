"""The built-in task's data: a character-level corpus shipped in the package, and its windows.

Everything the built-in task reads, without network access:

* :func:`load_corpus` — ≈350 KB of public-domain prose (five books of the King James Version,
  see ``data/README.md``), read with :mod:`importlib.resources` so it works from a wheel.
* :class:`CharTokenizer` — one id per distinct character, ids in sorted character order.
* :class:`CharDataset` — fixed-stride windows of ``block_size + 1`` token ids, served as
  ``(inputs, targets)`` with the targets shifted by one character.
* :func:`build_datasets` — train/validation split *by position*: the last ``val_fraction`` of
  the text is validation, so no window of one split overlaps the other.
* :func:`unigram_baseline` — the validation loss of "predict each character's training
  frequency": a trained model must clearly beat it.

The model that trains on it is in :mod:`gpu_training.tasks.charlm`, which re-exports these names.

Example:
    >>> import torch
    >>> data = build_datasets(block_size=32)
    >>> data.tokenizer.vocab_size, len(data.train) > len(data.val) > 0
    (72, True)
    >>> x, y = data.train[0]
    >>> data.tokenizer.decode(x[:11]), bool(torch.equal(x[1:], y[:-1]))
    ('Genesis 1\\nI', True)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import torch
from torch import Tensor
from torch.utils.data import Dataset

from gpu_training.config.checks import check_positive_int_argument

__all__ = [
    "CORPUS_RESOURCE",
    "CharData",
    "CharDataset",
    "CharTokenizer",
    "build_datasets",
    "load_corpus",
    "unigram_baseline",
]

CORPUS_RESOURCE = "data/kjv_selections.txt"
"""Path of the built-in corpus inside the ``gpu_training.tasks`` package."""


# --- corpus and tokenizer -------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def load_corpus() -> str:
    """The built-in corpus as one string (read once per process, then cached).

    Returns:
        ≈350,000 characters of public-domain prose, one verse per line.

    Example:
        >>> load_corpus()[:26]
        'Genesis 1\\nIn the beginning'
    """
    # importlib.resources, not __file__: the package may be a zip or an installed wheel.
    path = resources.files("gpu_training.tasks") / "data" / "kjv_selections.txt"
    return path.read_text(encoding="utf-8")


class CharTokenizer:
    """Maps each character of a fixed vocabulary to an integer id and back.

    Args:
        chars: The vocabulary in id order (id ``i`` is ``chars[i]``); no repeats.

    Raises:
        ValueError: If ``chars`` is empty or repeats a character.

    Example:
        >>> tok = CharTokenizer.from_text("hello world")
        >>> tok.vocab_size, tok.encode("hold").tolist()
        (8, [3, 5, 4, 1])
        >>> tok.decode(tok.encode("hold"))
        'hold'
        >>> CharTokenizer.from_state_dict(tok.state_dict()).chars == tok.chars
        True
    """

    def __init__(self, chars: str) -> None:
        if not isinstance(chars, str) or not chars:
            raise ValueError(f"tokenizer vocabulary must be a non-empty string, got {chars!r}")
        if len(set(chars)) != len(chars):
            repeated = sorted({c for c in chars if chars.count(c) > 1})
            raise ValueError(f"tokenizer vocabulary repeats characters: {repeated!r}")
        self._chars = chars
        self._stoi = {c: i for i, c in enumerate(chars)}
        # Code point -> id lookup table (-1: not in the vocabulary): encodes 350 KB in ~ms.
        table = torch.full((max(map(ord, chars)) + 1,), -1, dtype=torch.long)
        table[torch.tensor([ord(c) for c in chars])] = torch.arange(len(chars))
        self._table = table

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """A tokenizer whose vocabulary is the sorted distinct characters of ``text``."""
        return cls("".join(sorted(set(text))))

    @property
    def chars(self) -> str:
        """The vocabulary, in id order."""
        return self._chars

    @property
    def vocab_size(self) -> int:
        """Number of distinct ids."""
        return len(self._chars)

    def encode(self, text: str) -> Tensor:
        """The ids of ``text``'s characters.

        Args:
            text: A string made of vocabulary characters.

        Returns:
            A 1-D ``torch.long`` tensor of ``len(text)`` ids.

        Raises:
            ValueError: If ``text`` holds a character outside the vocabulary (named).
        """
        if not text:
            return torch.empty(0, dtype=torch.long)
        # utf-32-le is exactly one int32 code point per character, no byte-order mark.
        points = torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32).long()
        ids = self._table[points.clamp(max=len(self._table) - 1)]
        if bool(((ids < 0) | (points >= len(self._table))).any()):
            unknown = sorted({c for c in text if c not in self._stoi})
            raise ValueError(
                f"text has {len(unknown)} character(s) outside the tokenizer's vocabulary: "
                f"{''.join(unknown)[:20]!r}"
            )
        return ids

    def decode(self, ids: Tensor | Sequence[int]) -> str:
        """The string of a sequence of ids.

        Args:
            ids: A 1-D tensor or sequence of ids in ``[0, vocab_size)``.

        Returns:
            The decoded text.

        Raises:
            ValueError: If an id is out of range.
        """
        values = ids.reshape(-1).tolist() if isinstance(ids, Tensor) else list(ids)
        bad = [i for i in values if not 0 <= i < len(self._chars)]
        if bad:
            raise ValueError(
                f"token id {bad[0]} is out of range for a vocabulary of {len(self._chars)}"
            )
        return "".join(self._chars[i] for i in values)

    def state_dict(self) -> dict[str, str]:
        """The tokenizer as plain data (``{"chars": vocabulary}``), safe for any checkpoint."""
        return {"chars": self._chars}

    @classmethod
    def from_state_dict(cls, state: dict[str, str]) -> CharTokenizer:
        """Rebuilds a tokenizer from :meth:`state_dict`.

        Raises:
            ValueError: If ``state`` has no ``"chars"`` string.
        """
        if "chars" not in state:
            raise ValueError(f"tokenizer state has no 'chars' (keys: {sorted(state)})")
        return cls(state["chars"])

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


# --- datasets -------------------------------------------------------------------------------


class CharDataset(Dataset[tuple[Tensor, Tensor]]):
    """Windows of a token sequence as ``(inputs, targets)`` pairs for next-character prediction.

    Window ``i`` starts at ``i * stride`` and spans ``block_size + 1`` tokens: the inputs are
    its first ``block_size``, the targets its last ``block_size``. With the default stride
    (``block_size``) consecutive windows share one boundary token, so every token after the
    first is a target exactly once per epoch. Items are deterministic: no randomness here (the
    sampler shuffles).

    Args:
        tokens: 1-D tensor of token ids.
        block_size: Context length ``T`` of one sample.
        stride: Distance between window starts (default ``block_size``).

    Raises:
        ValueError: If ``block_size``/``stride`` are not positive, ``tokens`` is not 1-D, or
            it is shorter than one window.

    Example:
        >>> ds = CharDataset(torch.arange(10), block_size=4)
        >>> len(ds), [t.tolist() for t in ds[1]]
        (2, [[4, 5, 6, 7], [5, 6, 7, 8]])
    """

    def __init__(self, tokens: Tensor, block_size: int, stride: int | None = None) -> None:
        stride = block_size if stride is None else stride
        for name, value in (("block_size", block_size), ("stride", stride)):
            check_positive_int_argument(name, value)
        if tokens.dim() != 1:
            raise ValueError(f"tokens must be a 1-D tensor, got shape {tuple(tokens.shape)}")
        if tokens.numel() < block_size + 1:
            raise ValueError(
                f"{tokens.numel()} tokens are too few for one window of block_size + 1 = "
                f"{block_size + 1}"
            )
        self._tokens = tokens.long()
        self._block_size = block_size
        self._stride = stride
        self._len = (tokens.numel() - block_size - 1) // stride + 1

    @property
    def tokens(self) -> Tensor:
        """The whole token sequence the windows are cut from."""
        return self._tokens

    @property
    def block_size(self) -> int:
        """Context length of one sample."""
        return self._block_size

    @property
    def stride(self) -> int:
        """Distance between consecutive window starts."""
        return self._stride

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        """Window ``index`` as ``(inputs, targets)``, each a ``(block_size,)`` long tensor.

        Raises:
            IndexError: If ``index`` is out of range (negative indices count from the end).
        """
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(f"index {index} out of range for {self._len} windows")
        start = index * self._stride
        # Copies, not views: a view would drag the whole corpus' storage along when a
        # DataLoader worker sends an uncollated sample to the main process.
        window = self._tokens[start : start + self._block_size + 1].clone()
        return window[:-1], window[1:]

    def targets(self) -> Tensor:
        """Every target id of every window, window by window (``len(self) * block_size`` ids)."""
        starts = torch.arange(self._len) * self._stride
        offsets = torch.arange(1, self._block_size + 1)
        return self._tokens[(starts[:, None] + offsets[None, :]).reshape(-1)]


@dataclass
class CharData:
    """The built-in task's data: both splits and the tokenizer that made them."""

    train: CharDataset
    """Windows of the first ``1 - val_fraction`` of the corpus."""

    val: CharDataset
    """Windows of the last ``val_fraction`` of the corpus (no overlap with ``train``)."""

    tokenizer: CharTokenizer
    """Vocabulary of the whole corpus."""


def build_datasets(
    block_size: int = 128, val_fraction: float = 0.1, *, text: str | None = None
) -> CharData:
    """Tokenizes the corpus and splits it by position into training and validation windows.

    The first ``floor(len · (1 - val_fraction))`` characters are the training text, the rest
    the validation text; windows never cross the boundary, so no validation target is ever
    seen in training.

    Args:
        block_size: Context length of one sample.
        val_fraction: Share of the text, taken from its end, held out for validation.
        text: The corpus (default: :func:`load_corpus`).

    Returns:
        A :class:`CharData` with ``train``, ``val`` and ``tokenizer``.

    Raises:
        ValueError: If ``val_fraction`` is not in (0, 1) or a split is shorter than one window.

    Example:
        >>> data = build_datasets(block_size=64, val_fraction=0.1)
        >>> len(data.train.tokens) + len(data.val.tokens) == len(load_corpus())
        True
    """
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)):
        raise ValueError(f"val_fraction must be a number in (0, 1), got {val_fraction!r}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    corpus = load_corpus() if text is None else text
    tokenizer = CharTokenizer.from_text(corpus)
    tokens = tokenizer.encode(corpus)
    n_train = int(len(tokens) * (1.0 - val_fraction))
    for split, part in (("training", tokens[:n_train]), ("validation", tokens[n_train:])):
        if part.numel() < block_size + 1:
            raise ValueError(
                f"the {split} split has {part.numel()} characters, fewer than one window of "
                f"block_size + 1 = {block_size + 1}; change val_fraction or block_size"
            )
    return CharData(
        train=CharDataset(tokens[:n_train], block_size),
        val=CharDataset(tokens[n_train:], block_size),
        tokenizer=tokenizer,
    )


def unigram_baseline(data: CharData) -> float:
    """Validation cross-entropy of the unigram model estimated on the training text.

    Each character's probability is its add-one-smoothed frequency in the training text,
    ``(count + 1) / (N + V)``, whatever precedes it; the loss is the mean negative log
    probability of every validation target (the positions a validation loss averages over).
    A model that learned nothing about context scores about this.

    Args:
        data: The splits from :func:`build_datasets`.

    Returns:
        The baseline loss in nats per character (≈ 2.98 for the built-in corpus).

    Example:
        >>> round(unigram_baseline(build_datasets(block_size=128)), 2)
        2.98
    """
    vocab = data.tokenizer.vocab_size
    counts = torch.bincount(data.train.tokens, minlength=vocab).double()
    log_probs = torch.log((counts + 1.0) / (counts.sum() + vocab))
    return float(-log_probs[data.val.targets()].mean())
