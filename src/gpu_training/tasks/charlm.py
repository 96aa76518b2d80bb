"""The built-in task: a small GPT-style character language model on a corpus shipped in the package.

Everything a training job needs, without network access:

* :func:`load_corpus` — ≈350 KB of public-domain prose (five books of the King James Version,
  see ``data/README.md``), read with :mod:`importlib.resources` so it works from a wheel.
* :class:`CharTokenizer` — one id per distinct character, ids in sorted character order.
* :class:`CharDataset` — fixed-stride windows of ``block_size + 1`` token ids, served as
  ``(inputs, targets)`` with the targets shifted by one character.
* :func:`build_datasets` — train/validation split *by position*: the last ``val_fraction`` of
  the text is validation, so no window of one split overlaps the other.
* :func:`unigram_baseline` — the validation loss of "predict each character's training
  frequency": a trained model must clearly beat it.
* :class:`CharTransformer` — token + learned position embeddings, ``n_layer`` pre-LayerNorm
  :class:`Block` s with causal :func:`~torch.nn.functional.scaled_dot_product_attention`, and
  an LM head whose weight is the token embedding (weight tying).

Example:
    >>> import torch
    >>> data = build_datasets(block_size=32)
    >>> data.tokenizer.vocab_size, len(data.train) > len(data.val) > 0
    (72, True)
    >>> x, y = data.train[0]
    >>> data.tokenizer.decode(x[:11]), bool(torch.equal(x[1:], y[:-1]))
    ('Genesis 1\\nI', True)
    >>> cfg = CharLMConfig(block_size=32, n_layer=2, n_head=2, n_embd=32)
    >>> model = CharTransformer(cfg, vocab_size=data.tokenizer.vocab_size)
    >>> logits = model(x.unsqueeze(0))
    >>> tuple(logits.shape), loss_fn(logits, y.unsqueeze(0)).shape
    ((1, 32, 72), torch.Size([]))
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from gpu_training.config import ConfigError

__all__ = [
    "CORPUS_RESOURCE",
    "Block",
    "CausalSelfAttention",
    "CharData",
    "CharDataset",
    "CharLMConfig",
    "CharTokenizer",
    "CharTransformer",
    "build_datasets",
    "load_corpus",
    "loss_fn",
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
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
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


# --- model ----------------------------------------------------------------------------------


def _check_positive_int(name: str, value: object) -> None:
    # bool is an int subclass: `n_layer: true` in YAML must not pass as 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"field '{name}': expected a positive integer, got {value!r}", name)


@dataclass
class CharLMConfig:
    """Shape of the built-in character transformer and of its data.

    Example:
        >>> CharLMConfig(n_embd=130, n_head=4)
        Traceback (most recent call last):
        ...
        gpu_training.config.ConfigError: field 'n_embd': expected a multiple of n_head (4), got 130

    Raises:
        ConfigError: On construction, naming the field that is wrong.
    """

    block_size: int = 128
    """Context length: characters per sample and maximum sequence the model accepts."""

    n_layer: int = 4
    """Number of transformer blocks."""

    n_head: int = 4
    """Attention heads per block."""

    n_embd: int = 128
    """Width of the residual stream; a multiple of ``n_head``."""

    dropout: float = 0.0
    """Dropout probability in embeddings, attention and MLP (0 for exact parity tests)."""

    bias: bool = True
    """Biases in Linear and LayerNorm layers."""

    val_fraction: float = 0.1
    """Share of the corpus, taken from its end, held out for validation."""

    vocab_size: int | None = None
    """Rows of the embedding and LM head when more than the corpus's characters are wanted
    (a benchmark at GPT-2's shape pads to 50304); None: exactly the corpus's vocabulary."""

    def __post_init__(self) -> None:
        for name in ("block_size", "n_layer", "n_head", "n_embd"):
            _check_positive_int(name, getattr(self, name))
        if self.vocab_size is not None:
            _check_positive_int("vocab_size", self.vocab_size)
        if self.n_embd % self.n_head:
            raise ConfigError(
                f"field 'n_embd': expected a multiple of n_head ({self.n_head}), got {self.n_embd}",
                "n_embd",
            )
        for name, low, high in (("dropout", 0.0, 1.0), ("val_fraction", 0.0, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"field '{name}': expected a number, got {value!r}", name)
            ok = low <= value < high if name == "dropout" else low < value < high
            if not ok:
                interval = "[0, 1)" if name == "dropout" else "(0, 1)"
                raise ConfigError(
                    f"field '{name}': expected a number in {interval}, got {value}", name
                )
        if not isinstance(self.bias, bool):
            raise ConfigError(f"field 'bias': expected true or false, got {self.bias!r}", "bias")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names a task's options may set."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data."""
        return dataclasses.asdict(self)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position ``t`` only sees positions ``<= t``."""

    def __init__(self, config: CharLMConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, T, C) -> (B, T, C)``."""
        batch, seq, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        shape = (batch, seq, self.n_head, width // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))  # (B, H, T, Q)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(batch, seq, width)
        return self.resid_dropout(self.c_proj(y))


class _MLP(nn.Module):
    def __init__(self, config: CharLMConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """One pre-LayerNorm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``.

    The class name is what FSDP wrapping looks for (one shard unit per block).
    """

    def __init__(self, config: CharLMConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = _MLP(config)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, T, C) -> (B, T, C)``."""
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class CharTransformer(nn.Module):
    """A GPT-style decoder over characters (nanoGPT's architecture, sized for CPUs).

    Token and learned position embeddings, ``n_layer`` :class:`Block` s in ``self.blocks``,
    a final LayerNorm and an LM head that shares its weight with the token embedding.
    Weights start as in GPT-2: normal(0, 0.02), with each block's residual output
    projections scaled by ``1/sqrt(2·n_layer)`` so the residual stream's variance does not
    grow with depth; biases start at zero. One exception: the tied token embedding starts at
    normal(0, 1/sqrt(n_embd)) (rows of about unit norm), because with 0.02 a model this narrow
    trained at a high learning rate (3e-3) sits on the unigram plateau for its first hundred-odd
    steps. The price: untrained, the model favours repeating the input character (its tied
    logit is about ``sqrt(n_embd)``), so the first step's loss is 7-10 nats rather than
    ``ln(vocab_size)``; it falls below the unigram baseline within ~20 steps.

    Args:
        config: The model's shape.
        vocab_size: Number of token ids.

    Raises:
        ValueError: If ``vocab_size`` is not a positive integer.

    Example:
        >>> model = CharTransformer(CharLMConfig(block_size=16, n_layer=1, n_head=2, n_embd=8), 5)
        >>> model.lm_head.weight is model.wte.weight
        True
        >>> tuple(model(torch.zeros(3, 16, dtype=torch.long)).shape)
        (3, 16, 5)
    """

    def __init__(self, config: CharLMConfig, vocab_size: int) -> None:
        super().__init__()
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        self.config = config
        self.vocab_size = vocab_size
        self.wte = nn.Embedding(vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, vocab_size, bias=False)
        # Weight tying: one (V, C) matrix embeds tokens and scores them.
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        # Tied embedding at 1/sqrt(width), not 0.02: with 0.02, Adam's first steps at lr 3e-3
        # push every row along one shared "unigram" direction and the loss stalls there
        # (measured, 4 × 128 wide, batch 32 × 64: ≈ 3.0 nats after 55 steps in 5 of 5 seeds;
        # 2.32-2.51 after 60 with this).
        nn.init.normal_(self.wte.weight, mean=0.0, std=config.n_embd**-0.5)
        residual_std = 0.02 / math.sqrt(2 * config.n_layer)
        for block in self.blocks:
            assert isinstance(block, Block)
            nn.init.normal_(block.attn.c_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.c_proj.weight, mean=0.0, std=residual_std)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor) -> Tensor:
        """Next-token logits for every position.

        Args:
            idx: ``(B, T)`` token ids, ``T <= block_size``.

        Returns:
            ``(B, T, vocab_size)`` logits; position ``t`` depends only on ``idx[:, :t+1]``.

        Raises:
            ValueError: If ``idx`` is not 2-D or longer than ``block_size``.
        """
        if idx.dim() != 2:
            raise ValueError(f"idx must be (batch, time), got shape {tuple(idx.shape)}")
        seq = idx.size(1)
        if seq > self.config.block_size:
            raise ValueError(
                f"sequence length {seq} exceeds the model's block_size {self.config.block_size}"
            )
        pos = torch.arange(seq, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits: Tensor = self.lm_head(self.ln_f(x))
        return logits

    def num_parameters(self, non_embedding: bool = True) -> int:
        """Number of distinct parameters (the tied embedding/head matrix counts once).

        Args:
            non_embedding: Leave out the position embedding, a table lookup that costs no
                FLOPs. The token embedding stays in: tied, it is also the LM head's matmul
                weight (nanoGPT's convention, so :meth:`flops_per_token` counts the head).

        Returns:
            The parameter count.
        """
        total = sum(p.numel() for p in self.parameters())  # parameters() dedups tied weights
        return total - self.wpe.weight.numel() if non_embedding else total

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token (forward + backward), as in PaLM's appendix and nanoGPT.

        ``6·N + 12·L·H·Q·T``: ``N`` = :meth:`num_parameters` (non-embedding), each weight
        costs 2 FLOPs per token forward (multiply + add) and 4 backward; the attention scores
        ``QKᵀ`` and the weighted sum ``AV`` add ``2·2·T·H·Q`` forward per layer, ×3 with the
        backward. ``L`` layers, ``H`` heads, ``Q = n_embd / H`` head dim, ``T`` sequence length
        (the causal mask is not discounted). Multiply by tokens per second for achieved FLOP/s.

        Args:
            seq_len: Sequence length ``T`` (default ``block_size``).

        Returns:
            FLOPs per trained token.

        Example:
            >>> cfg = CharLMConfig(block_size=8, n_layer=1, n_head=2, n_embd=4)
            >>> m = CharTransformer(cfg, vocab_size=3)
            >>> m.flops_per_token() == 6 * m.num_parameters() + 12 * 1 * 2 * 2 * 8
            True
        """
        t = self.config.block_size if seq_len is None else seq_len
        head_dim = self.config.n_embd // self.config.n_head
        n, layers, heads = self.num_parameters(), self.config.n_layer, self.config.n_head
        return 6 * n + 12 * layers * heads * head_dim * t

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Samples ``max_new_tokens`` characters after the prompt ``idx`` (``(B, T)`` ids).

        Args:
            idx: Prompt token ids, ``(B, T)`` with ``T >= 1``.
            max_new_tokens: Characters to append.
            temperature: Divides the logits; lower is greedier (must be > 0).
            generator: Random generator for the sampling (default: the global one).

        Returns:
            ``(B, T + max_new_tokens)`` ids (the prompt, then the samples).

        Raises:
            ValueError: If ``temperature`` is not positive.
        """
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size :]
            logits = self(context)[:, -1, :] / temperature
            probs = torch.softmax(logits, dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
        return idx


def loss_fn(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy over every position of every sample.

    Args:
        logits: ``(B, T, V)`` model outputs.
        targets: ``(B, T)`` next-token ids.

    Returns:
        A 0-d tensor: the loss in nats per character.
    """
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
