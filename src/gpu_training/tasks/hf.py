"""The Hugging Face task: a causal LM from local files, trained on your text files.

``task: hf`` in a job file, with its options under ``task_options``::

    task: hf
    task_options:
      config: configs/hf/tiny_llama.json   # pre-train from scratch (a dict works too) ...
      # model_dir: models/Llama-3.2-1B     # ... or fine-tune a local from_pretrained dir
      tokenizer: configs/hf/tokenizer      # default: model_dir
      train_files: [corpus/*.txt]          # .txt, .jsonl, .parquet (globs allowed)
      # stream: data/shards/             # ... or read lazily, tokenized on the fly
      block_size: 256                      # tokens per sample
      lora: {r: 8, lora_alpha: 16, target_modules: [q_proj, v_proj]}   # optional (peft)

Nothing is downloaded: a name that would need the Hugging Face Hub is refused in one line
that says how to fetch it first. The model is any causal LM the installed ``transformers``
supports (``AutoModelForCausalLM``), built in ``dtype`` with ``attn_implementation``; the
Trainer calls it on token ids and scores its ``.logits`` against the shifted targets with the
default ``(sum, count)`` cross-entropy (targets of -100 — prompt tokens of instruction data —
are not scored, and the count is the global batch's). ``train_files`` are tokenized once into
a cache and packed (:mod:`gpu_training.tasks.hf_data`); ``stream: <path>`` (with
``stream_reader``, ``text_field``, ``stream_workers``, the built-in task's names) is read
lazily instead, each record tokenized on the fly into one window
(:mod:`gpu_training.tasks.hf_stream`), resumable at any world size.

With ``lora``, the base is frozen and ``peft`` adds adapters to the named modules; the
optimizer gets only what trains, and checkpoints hold only the adapters (the frozen base is
read again from ``model_dir``). Every checkpoint carries the model's config and the tokenizer
files (:func:`checkpoint_extra`), so ``gpu-training ckpt export-hf`` needs nothing else.

``transformers`` and ``peft`` are imported when a model or tokenizer is built, not before.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpu_training.meta_device import meta_device
from gpu_training.tasks.hf_model import (
    build_hf_model,
    hf_config,
    is_pretrained_model,
    keep_only_trainable_in_state_dict,
    load_tokenizer,
)
from gpu_training.tasks.hf_options import DTYPES, HFTaskOptions, option_error

__all__ = [
    "DTYPES",
    "HFTaskOptions",
    "checkpoint_extra",
    "hf_config",
    "hf_task",
    "is_pretrained_model",
    "keep_only_trainable_in_state_dict",
    "load_tokenizer",
    "plan_task",
]

_DEFAULT_CACHE = Path("~/.cache/gpu_training/tokens")
_EXTRA_KEY = "hf"  # the checkpoint's extra["hf"]: what export-hf needs


# --- what a checkpoint carries ----------------------------------------------------------------


def _files_as_tensors(directory: Path | None) -> dict[str, torch.Tensor]:
    """The tokenizer's files as byte tensors: plain data that ``weights_only`` loads."""
    from gpu_training.tasks.hf_data import tokenizer_files

    if directory is None:
        return {}
    return {
        path.name: torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)
        for path in tokenizer_files(directory)
    }


def checkpoint_extra(
    model: nn.Module, *, tokenizer_dir: Path | None = None, base_dir: str | None = None
) -> dict[str, Any]:
    """What ``ckpt export-hf`` needs, as plain data for a checkpoint's ``extra``.

    Args:
        model: The trained model, unwrapped (no DDP or DeepSpeed engine around it); nothing
            is added unless it is a ``transformers`` model or a ``peft`` model of one.
        tokenizer_dir: The tokenizer's directory, whose files are carried along.
        base_dir: LoRA: the frozen base's ``model_dir``.

    Returns:
        ``{}``, or ``{"hf": {"config": JSON text, "architecture": class name,
        "tokenizer_files": {name: uint8 tensor}, "peft": JSON text or None,
        "base_dir": str or None}}``.
    """
    inner: Any = model  # a transformers/peft model: untyped attributes
    if not is_pretrained_model(inner):
        return {}
    peft_config: str | None = None
    base: Any = inner
    if hasattr(inner, "get_base_model") and hasattr(inner, "peft_config"):
        base = inner.get_base_model()
        settings = inner.peft_config["default"].to_dict()
        peft_config = json.dumps(
            settings, default=lambda v: sorted(v) if isinstance(v, set) else str(v)
        )
    # FSDP2 swaps in a subclass (FSDPLlamaForCausalLM): name the transformers class
    arch = next(
        (c.__name__ for c in type(base).__mro__ if c.__module__.startswith("transformers.")),
        type(base).__name__,
    )
    config = base.config.to_dict()
    config["architectures"] = [arch]
    config.pop("use_cache", None)  # inference after export keeps its cache
    return {
        _EXTRA_KEY: {
            "config": json.dumps(config, default=str),
            "architecture": arch,
            "tokenizer_files": _files_as_tensors(tokenizer_dir),
            "peft": peft_config,
            "base_dir": str(Path(base_dir).resolve()) if base_dir is not None else None,
        }
    }


# --- the task ---------------------------------------------------------------------------------


def _count_params(model: nn.Module) -> tuple[int, int]:
    seen: set[int] = set()
    total = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return total, trainable


def hf_task(options: Mapping[str, Any] | HFTaskOptions) -> Any:
    """The :class:`~gpu_training.tasks.Task` of ``task: hf``.

    Checks the options and reads the model's config now (no weights); ``build_model``
    loads or initialises the model, ``build_data`` tokenizes ``train_files`` once into the
    cache (or reads it) and returns packed windows, or returns ``stream`` as a
    :class:`~gpu_training.streaming.SampleStream` tokenized on the fly.

    Args:
        options: :class:`HFTaskOptions` fields.

    Returns:
        The task (name ``hf``), with ``tokens_per_sample`` and ``flops_per_token`` set.

    Raises:
        ConfigError: One line naming the option or the file.
    """
    from gpu_training.tasks import Task, cross_entropy_loss, cross_entropy_sum

    opts = options if isinstance(options, HFTaskOptions) else HFTaskOptions.from_mapping(options)
    config = hf_config(opts)
    context = int(getattr(config, "max_position_embeddings", 0) or 1024)
    block = opts.block_size or min(context, 1024)
    if block > context:
        raise option_error(
            "block_size", f"{block} exceeds the model's context ({context} positions)"
        )
    with meta_device():
        shape: Any = build_hf_model(opts, config)
    total, trainable = _count_params(shape)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    flops = 6 * total + 12 * layers * hidden * block
    source = opts.model_dir or (opts.config if isinstance(opts.config, str) else "a config")
    lora = f", LoRA: {trainable:,} trainable" if opts.lora is not None else ""
    describe = (
        f"{type(shape.get_base_model() if opts.lora else shape).__name__} from {source} "
        f"({layers} layers, width {hidden}, {total / 1e6:.2f}M parameters{lora})"
        + (f", {len(opts.train_files)} training file(s)" if opts.train_files else "")
        + (f", training stream {opts.stream} ({opts.stream_reader})" if opts.stream else "")
        + f", windows of {block} tokens"
    )
    tokenizer_dir = opts.tokenizer_dir

    def build_model() -> nn.Module:
        return build_hf_model(opts, config)

    def build_data() -> Any:
        from gpu_training.tasks.hf_data import (
            DataSpec,
            PackedWindows,
            build_datasets,
            prepare_tokens,
        )
        from gpu_training.tasks.hf_stream import hf_stream

        if not opts.train_files and opts.stream is None:
            raise option_error(
                "train_files",
                "no training data: list .txt, .jsonl or .parquet files, or give a stream",
            )
        tokenizer = load_tokenizer(opts)
        vocab = int(getattr(config, "vocab_size", 0) or 0)
        if vocab and len(tokenizer) > vocab:
            raise option_error(
                "tokenizer",
                f"{tokenizer_dir}: {len(tokenizer)} tokens do not fit the model's vocab_size {vocab}",
            )
        fields: dict[str, Any] = {
            "text_field": opts.text_field,
            "prompt_field": opts.prompt_field,
            "response_field": opts.response_field,
        }
        cache_dir = Path(opts.cache_dir or _DEFAULT_CACHE).expanduser()
        val = DataSpec(tuple(Path(f) for f in opts.val_files), **fields) if opts.val_files else None
        if opts.stream is not None:  # tokenized on the fly; validation only from val_files
            reader, text = opts.stream_reader, opts.text_field
            stream = hf_stream(opts.stream, tokenizer, block, reader=reader, text_field=text)
            if val is None:
                return stream, None
            held = prepare_tokens(val, tokenizer, cache_dir, tokenizer_dir=tokenizer_dir)
            return stream, PackedWindows(held, block)
        train = DataSpec(tuple(Path(f) for f in opts.train_files), **fields)
        return build_datasets(
            train,
            val,
            tokenizer,
            block_size=block,
            val_fraction=float(opts.val_fraction),
            cache_dir=cache_dir,
            tokenizer_dir=tokenizer_dir,
        )

    def extra(model: nn.Module) -> dict[str, Any]:
        return checkpoint_extra(
            model, tokenizer_dir=tokenizer_dir, base_dir=opts.model_dir if opts.lora else None
        )

    return Task(
        name="hf",
        build_model=build_model,
        build_data=build_data,
        loss_fn=cross_entropy_loss,
        loss_sum=cross_entropy_sum,
        describe=describe,
        tokens_per_sample=block,
        flops_per_token=flops,
        loader_workers=opts.stream_workers,
        checkpoint_extra=extra,
    )


class _ShapeTokens(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Token ids of the right shape and range, for measuring (``plan``): no files, no tokenizer."""

    def __init__(self, vocab_size: int, block_size: int) -> None:
        self.vocab_size, self.block_size = vocab_size, block_size

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.arange(self.block_size + 1) % max(1, self.vocab_size)
        return ids[:-1], ids[1:]


def plan_task(config: str, block_size: int | None = None) -> Any:
    """The ``hf`` task of a config file, with stand-in data of its shape (for ``plan``).

    Args:
        config: A ``config.json`` path or the directory holding one.
        block_size: Tokens per sample (default: the model's context, at most 1024).

    Returns:
        A :class:`~gpu_training.tasks.Task` whose data is one window of token ids.

    Raises:
        ConfigError: If the config is missing, does not parse, or ``block_size`` exceeds the
            model's context.
    """
    opts = HFTaskOptions(config=config, block_size=block_size)
    task = hf_task(opts)
    vocab = int(getattr(hf_config(opts), "vocab_size", 0) or 0)
    shape = _ShapeTokens(vocab, int(task.tokens_per_sample))
    return dataclasses.replace(task, build_data=lambda: (shape, None))
