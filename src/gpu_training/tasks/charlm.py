"""The built-in task's model: a small GPT-style character language model.

* :class:`CharLMConfig` — the model's shape (and the validation share of its data), checked on
  construction; a task's options set its fields.
* :class:`CharTransformer` — token + learned position embeddings, ``n_layer`` pre-LayerNorm
  :class:`Block` s with causal :func:`~torch.nn.functional.scaled_dot_product_attention`, and
  an LM head whose weight is the token embedding (weight tying).
* :func:`loss_fn` — mean cross-entropy over every position, in nats per character.

The data it trains on (corpus, tokenizer, windows, splits, unigram baseline) lives in
:mod:`gpu_training.tasks.chardata`; its names are re-exported here, so
``from gpu_training.tasks.charlm import build_datasets`` keeps working. The built-in ``charlm``
task that joins the two is :func:`gpu_training.tasks.charlm_task`.

Example:
    >>> import torch
    >>> data = build_datasets(block_size=32)
    >>> x, y = data.train[0]
    >>> cfg = CharLMConfig(block_size=32, n_layer=2, n_head=2, n_embd=32)
    >>> model = CharTransformer(cfg, vocab_size=data.tokenizer.vocab_size)
    >>> logits = model(x.unsqueeze(0))
    >>> tuple(logits.shape), loss_fn(logits, y.unsqueeze(0)).shape
    ((1, 32, 72), torch.Size([]))
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpu_training.config import ConfigError
from gpu_training.config.checks import check_positive_int_argument
from gpu_training.tasks.chardata import (
    CORPUS_RESOURCE,
    CharData,
    CharDataset,
    CharTokenizer,
    build_datasets,
    load_corpus,
    unigram_baseline,
)
from gpu_training.tasks.stream_options import check_stream_options

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

    stream: str | None = None
    """Train on a stream instead: a .jsonl/.txt/.parquet file or a directory of them, read
    lazily, one sample per record, tokenized on the fly (validation stays the corpus's)."""

    stream_reader: str = "files"
    """How the stream is read: ``files`` (the toolkit's reader) or ``hf`` (``datasets``)."""

    text_field: str = "text"
    """JSONL/Parquet streams: the field holding a record's text."""

    stream_workers: int = 0
    """DataLoader worker processes that decode and tokenize the stream."""

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
        check_stream_options(self.stream, self.stream_reader, self.stream_workers)
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
    """Multi-head self-attention where position ``t`` only sees positions ``<= t``.

    Under tensor parallel (the ``colwise_qkv`` style on ``c_attn``, ``rowwise`` on ``c_proj``)
    each rank computes its share of the heads: ``c_attn`` gives it their query, key and value,
    and ``c_attn.packed_shard`` says which share. With dropout the mask is drawn over all the
    heads, as one process draws it, and each rank keeps its heads' part.
    """

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
        head_dim = width // self.n_head
        q, k, v = self.c_attn(x).chunk(3, dim=2)  # under TP: this rank's heads only
        heads = q.size(-1) // head_dim
        q, k, v = (t.view(batch, seq, heads, head_dim).transpose(1, 2) for t in (q, k, v))
        if self.training and self.dropout > 0:
            y = self._attend_with_dropout(q, k, v)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(batch, seq, heads * head_dim)
        return self.resid_dropout(self.c_proj(y))

    def _attend_with_dropout(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        batch, heads, seq, head_dim = q.shape
        rank, _ = getattr(self.c_attn, "packed_shard", (0, 1))
        # One draw over every head, whatever the split: the same mask on 1 process or N.
        keep = torch.empty(batch, self.n_head, seq, seq, device=q.device)
        keep = keep.bernoulli_(1 - self.dropout)[:, rank * heads : (rank + 1) * heads]
        scores = (q @ k.transpose(-2, -1)) * head_dim**-0.5
        future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
        probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        return (probs * keep / (1 - self.dropout)).to(v.dtype) @ v


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
    trained at a high learning rate (3e-3) sits on the unigram plateau for many steps. The
    price: untrained, the model favours repeating the input character (its tied logit is
    about ``sqrt(n_embd)``), so the first step's loss is well above ``ln(vocab_size)``; it
    falls below the unigram baseline soon after (benchmarks/README.md, "Traps").

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

    tp_plan: ClassVar[dict[str, str]] = {
        "blocks.*.attn.c_attn": "colwise_qkv",
        "blocks.*.attn.c_proj": "rowwise",
        "blocks.*.mlp.c_fc": "colwise",
        "blocks.*.mlp.c_proj": "rowwise",
    }
    """Tensor parallel (``strategy.tensor_parallel``): each block's attention (its heads) and
    MLP split over the ranks, Megatron's way; embeddings, norms and the head stay whole."""

    def __init__(self, config: CharLMConfig, vocab_size: int) -> None:
        super().__init__()
        check_positive_int_argument("vocab_size", vocab_size)
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
        # (benchmarks/README.md, "Traps").
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
