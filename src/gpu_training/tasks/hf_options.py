"""``task_options`` of ``task: hf`` (:mod:`gpu_training.tasks.hf`), checked on construction.

Every mistake is one line naming the option (``field 'task_options.<name>': ...``); a model,
config or tokenizer that would need the Hugging Face Hub is refused with how to fetch it
first. Nothing here imports ``transformers``.

Example:
    >>> HFTaskOptions(config={"model_type": "llama"}, dtype="fp8")
    Traceback (most recent call last):
    ...
    gpu_training.config.ConfigError: field 'task_options.dtype': expected one of float32, bfloat16, float16, auto, got 'fp8'
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpu_training.config import ConfigError
from gpu_training.tasks.stream_options import check_stream_options

__all__ = ["DTYPES", "HFTaskOptions", "option_error"]

DTYPES: dict[str, torch.dtype | str] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "auto": "auto",
}
"""``task_options.dtype`` values: the dtype the weights are built or loaded in."""


def option_error(name: str, message: str) -> ConfigError:
    """The one-line error of option ``name``: ``field 'task_options.<name>': <message>``."""
    field_name = f"task_options.{name}"
    return ConfigError(f"field '{field_name}': {message}", field_name)


def _looks_like_hub_name(text: str) -> bool:
    parts = text.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not text.startswith((".", "~", os.sep))
        and not Path(parts[0]).exists()
    )


def _local_dir(name: str, value: str, what: str) -> Path:
    """``value`` as an existing local directory, or one line saying how to get it."""
    path = Path(value).expanduser()
    if path.is_dir():
        return path
    if _looks_like_hub_name(value):
        raise option_error(
            name,
            f"'{value}' is not a local directory; it looks like a Hugging Face Hub name and "
            "nothing is downloaded here: fetch it first (huggingface-cli download "
            f"{value} --local-dir models/{value.split('/')[1]}) and give that directory "
            f"(or, if it is a path, check it: no {path.resolve()})",
        )
    kind = "a file, not a directory" if path.exists() else "no such directory"
    raise option_error(name, f"{value}: {kind}; expected a local directory holding {what}")


@dataclass
class HFTaskOptions:
    """``task_options`` of ``task: hf`` (checked on construction, one line per mistake)."""

    model_dir: str | None = None
    """A local ``from_pretrained`` directory (config.json, safetensors, tokenizer files)."""

    config: str | dict[str, Any] | None = None
    """Pre-training from scratch: a ``config.json`` path (or its directory), or the config as
    a mapping with ``model_type`` (e.g. ``{model_type: llama, hidden_size: 256, ...}``)."""

    tokenizer: str | None = None
    """A local tokenizer directory (default: ``model_dir``)."""

    dtype: str = "float32"
    """Weights' dtype: ``float32`` (master weights; ``training.precision`` sets the compute),
    ``bfloat16``, ``float16`` or ``auto`` (the checkpoint's)."""

    attn_implementation: str | None = None
    """``eager``, ``sdpa``, ``flash_attention_2``...; None: transformers' default."""

    train_files: list[str] = field(default_factory=list)
    """Training text: ``.txt``/``.md`` (a file is a document), ``.jsonl``, ``.parquet``; globs."""

    stream: str | None = None
    """Train on a stream instead of ``train_files``: a .jsonl/.txt/.parquet file or a directory
    of them, read lazily, each record tokenized on the fly into one window
    (:mod:`gpu_training.tasks.hf_stream`); validation then comes from ``val_files`` only."""

    stream_reader: str = "files"
    """How the stream is read: ``files`` (the toolkit's reader) or ``hf`` (``datasets``)."""

    stream_workers: int = 0
    """DataLoader worker processes that read and tokenize the stream."""

    val_files: list[str] = field(default_factory=list)
    """Validation files; none: the last ``val_fraction`` of the training windows."""

    val_fraction: float = 0.05
    """Share of the training windows held out when no ``val_files`` are given (0: none)."""

    block_size: int | None = None
    """Tokens per sample (default: the model's context, at most 1024)."""

    text_field: str = "text"
    """JSONL/Parquet field of a document's text."""

    prompt_field: str | None = None
    """Instruction data: the prompt's field (its tokens are not scored)."""

    response_field: str | None = None
    """Instruction data: the response's field (the loss is on these tokens and EOS)."""

    cache_dir: str | None = None
    """Where tokenized data is cached (default ``~/.cache/gpu_training/tokens``)."""

    lora: dict[str, Any] | None = None
    """LoRA adapters (``peft.LoraConfig`` fields: ``r``, ``lora_alpha``, ``lora_dropout``,
    ``target_modules``...) on a frozen ``model_dir`` base."""

    def __post_init__(self) -> None:
        if (self.model_dir is None) == (self.config is None):
            raise option_error(
                "model_dir",
                "give exactly one of model_dir (a local from_pretrained directory) and config "
                "(a config.json or a mapping, to pre-train from scratch)",
            )
        if self.model_dir is not None:
            _local_dir("model_dir", _str("model_dir", self.model_dir), "a from_pretrained model")
        if isinstance(self.config, str):
            path = Path(self.config).expanduser()
            if not (path.is_file() or (path / "config.json").is_file()):
                if _looks_like_hub_name(self.config):
                    _local_dir("config", self.config, "a config.json")  # the Hub hint
                raise option_error(
                    "config", f"{self.config}: no such config.json file or directory"
                )
        elif self.config is not None and not isinstance(self.config, dict):
            raise option_error("config", f"expected a path or a mapping, got {self.config!r}")
        elif isinstance(self.config, dict) and "model_type" not in self.config:
            raise option_error("config", "a config mapping needs 'model_type' (e.g. llama, gpt2)")
        if self.tokenizer is not None:
            _local_dir("tokenizer", _str("tokenizer", self.tokenizer), "tokenizer files")
        if self.dtype not in DTYPES:
            raise option_error("dtype", f"expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in ("attn_implementation", "cache_dir", "prompt_field", "response_field"):
            if getattr(self, name) is not None:
                _str(name, getattr(self, name))
        _str("text_field", self.text_field)
        self.train_files = _file_list("train_files", self.train_files)
        self.val_files = _file_list("val_files", self.val_files)
        check_stream_options(
            self.stream, self.stream_reader, self.stream_workers, prefix="task_options."
        )
        if self.stream is not None and self.train_files:
            raise option_error(
                "stream",
                "give train_files (tokenized once, packed) or stream (tokenized on the fly), "
                "not both",
            )
        if self.stream is not None and self.prompt_field is not None:
            raise option_error(
                "prompt_field",
                "a stream trains on text records (text_field): instruction data needs train_files",
            )
        if (self.prompt_field is None) != (self.response_field is None):
            raise option_error(
                "prompt_field", "instruction data needs both prompt_field and response_field"
            )
        if isinstance(self.val_fraction, bool) or not (
            isinstance(self.val_fraction, (int, float)) and 0 <= self.val_fraction < 1
        ):
            raise option_error(
                "val_fraction", f"expected a number in [0, 1), got {self.val_fraction!r}"
            )
        if self.block_size is not None and (
            isinstance(self.block_size, bool)
            or not isinstance(self.block_size, int)
            or self.block_size < 1
        ):
            raise option_error("block_size", f"expected an integer >= 1, got {self.block_size!r}")
        if self.lora is not None:
            if not isinstance(self.lora, dict):
                raise option_error(
                    "lora", f"expected a mapping of LoraConfig fields, got {self.lora!r}"
                )
            if self.model_dir is None:
                raise option_error("lora", "LoRA adapts a pretrained base: give model_dir")

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> HFTaskOptions:
        """Options from a job file's ``task_options`` (unknown keys named, with a hint)."""
        names = [f.name for f in dataclasses.fields(cls)]
        for key in options:
            if key not in names:
                import difflib

                close = difflib.get_close_matches(str(key), names, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ConfigError(
                    f"task 'hf' has no option '{key}'{hint}; options: {', '.join(names)}",
                    f"task_options.{key}",
                )
        return cls(**dict(options))

    @property
    def tokenizer_dir(self) -> Path | None:
        """The tokenizer's directory: ``tokenizer``, else ``model_dir``."""
        chosen = self.tokenizer or self.model_dir
        return Path(chosen).expanduser() if chosen is not None else None


def _str(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise option_error(name, f"expected a non-empty string, got {value!r}")
    return value


def _file_list(name: str, value: object) -> list[str]:
    """Paths and globs, expanded and sorted per pattern; each must match a file."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v for v in items):
        raise option_error(name, f"expected a list of file paths or globs, got {value!r}")
    files: list[str] = []
    for pattern in items:
        expanded = os.path.expanduser(pattern)
        matches = sorted(glob.glob(expanded)) if glob.has_magic(expanded) else [expanded]
        matches = [m for m in matches if Path(m).is_file()]
        if not matches:
            raise option_error(name, f"{pattern}: no such file")
        files += matches
    return files
