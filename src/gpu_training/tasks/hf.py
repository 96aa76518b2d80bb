"""The Hugging Face task: a causal LM from local files, trained on your text files.

``task: hf`` in a job file, with its options under ``task_options``::

    task: hf
    task_options:
      config: configs/hf/tiny_llama.json   # pre-train from scratch (a dict works too) ...
      # model_dir: models/Llama-3.2-1B     # ... or fine-tune a local from_pretrained dir
      tokenizer: configs/hf/tokenizer      # default: model_dir
      train_files: [corpus/*.txt]          # .txt, .jsonl, .parquet (globs allowed)
      block_size: 256                      # tokens per sample
      lora: {r: 8, lora_alpha: 16, target_modules: [q_proj, v_proj]}   # optional (peft)

Nothing is downloaded: a name that would need the Hugging Face Hub is refused in one line
that says how to fetch it first. The model is any causal LM the installed ``transformers``
supports (``AutoModelForCausalLM``), built in ``dtype`` with ``attn_implementation``; the
Trainer calls it on token ids and scores its ``.logits`` against the shifted targets with the
default ``(sum, count)`` cross-entropy (targets of -100 — prompt tokens of instruction data —
are not scored, and the count is the global batch's). Data is tokenized once into a cache
(:mod:`gpu_training.tasks.hf_data`).

With ``lora``, the base is frozen and ``peft`` adds adapters to the named modules; the
optimizer gets only what trains, and checkpoints hold only the adapters (the frozen base is
read again from ``model_dir``). Every checkpoint carries the model's config and the tokenizer
files (:func:`checkpoint_extra`), so ``gpu-training ckpt export-hf`` needs nothing else.

``transformers`` and ``peft`` are imported when a model or tokenizer is built, not before.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpu_training.config import ConfigError
from gpu_training.meta_device import meta_device

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

DTYPES: dict[str, torch.dtype | str] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "auto": "auto",
}
"""``task_options.dtype`` values: the dtype the weights are built or loaded in."""

_DEFAULT_CACHE = Path("~/.cache/gpu_training/tokens")
_EXTRA_KEY = "hf"  # the checkpoint's extra["hf"]: what export-hf needs


def _error(name: str, message: str) -> ConfigError:
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
        raise _error(
            name,
            f"'{value}' is not a local directory; it looks like a Hugging Face Hub name and "
            "nothing is downloaded here: fetch it first (huggingface-cli download "
            f"{value} --local-dir models/{value.split('/')[1]}) and give that directory "
            f"(or, if it is a path, check it: no {path.resolve()})",
        )
    kind = "a file, not a directory" if path.exists() else "no such directory"
    raise _error(name, f"{value}: {kind}; expected a local directory holding {what}")


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
            raise _error(
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
                raise _error("config", f"{self.config}: no such config.json file or directory")
        elif self.config is not None and not isinstance(self.config, dict):
            raise _error("config", f"expected a path or a mapping, got {self.config!r}")
        elif isinstance(self.config, dict) and "model_type" not in self.config:
            raise _error("config", "a config mapping needs 'model_type' (e.g. llama, gpt2)")
        if self.tokenizer is not None:
            _local_dir("tokenizer", _str("tokenizer", self.tokenizer), "tokenizer files")
        if self.dtype not in DTYPES:
            raise _error("dtype", f"expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in ("attn_implementation", "cache_dir", "prompt_field", "response_field"):
            if getattr(self, name) is not None:
                _str(name, getattr(self, name))
        _str("text_field", self.text_field)
        self.train_files = _file_list("train_files", self.train_files)
        self.val_files = _file_list("val_files", self.val_files)
        if (self.prompt_field is None) != (self.response_field is None):
            raise _error(
                "prompt_field", "instruction data needs both prompt_field and response_field"
            )
        if isinstance(self.val_fraction, bool) or not (
            isinstance(self.val_fraction, (int, float)) and 0 <= self.val_fraction < 1
        ):
            raise _error("val_fraction", f"expected a number in [0, 1), got {self.val_fraction!r}")
        if self.block_size is not None and (
            isinstance(self.block_size, bool)
            or not isinstance(self.block_size, int)
            or self.block_size < 1
        ):
            raise _error("block_size", f"expected an integer >= 1, got {self.block_size!r}")
        if self.lora is not None:
            if not isinstance(self.lora, dict):
                raise _error("lora", f"expected a mapping of LoraConfig fields, got {self.lora!r}")
            if self.model_dir is None:
                raise _error("lora", "LoRA adapts a pretrained base: give model_dir")

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
        raise _error(name, f"expected a non-empty string, got {value!r}")
    return value


def _file_list(name: str, value: object) -> list[str]:
    """Paths and globs, expanded and sorted per pattern; each must match a file."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v for v in items):
        raise _error(name, f"expected a list of file paths or globs, got {value!r}")
    files: list[str] = []
    for pattern in items:
        expanded = os.path.expanduser(pattern)
        matches = sorted(glob.glob(expanded)) if glob.has_magic(expanded) else [expanded]
        matches = [m for m in matches if Path(m).is_file()]
        if not matches:
            raise _error(name, f"{pattern}: no such file")
        files += matches
    return files


# --- building ---------------------------------------------------------------------------------


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-rank weight-loading bars would flood the log
    hf_logging.set_verbosity_error()


def hf_config(options: HFTaskOptions) -> Any:
    """The model's ``PretrainedConfig`` (from ``model_dir`` or ``config``), ``use_cache`` off.

    Raises:
        ConfigError: Naming the field, when the config does not parse or names an unknown
            ``model_type``.
    """
    _quiet_transformers()
    from transformers import AutoConfig

    try:
        if options.model_dir is not None:
            config = AutoConfig.from_pretrained(options.model_dir, local_files_only=True)
        elif isinstance(options.config, dict):
            data = dict(options.config)
            config = AutoConfig.for_model(data.pop("model_type"), **data)
        else:
            assert options.config is not None
            path = Path(options.config).expanduser()
            path = path / "config.json" if path.is_dir() else path
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or "model_type" not in data:
                raise ValueError("expected a JSON object with 'model_type'")
            config = AutoConfig.for_model(data.pop("model_type"), **data)
    except (ValueError, KeyError, OSError, TypeError) as err:
        where = "model_dir" if options.model_dir is not None else "config"
        raise _error(where, f"not a usable model config: {' '.join(str(err).split())}") from None
    config.use_cache = False  # training: no key/value cache in the outputs
    return config


def load_tokenizer(options: HFTaskOptions) -> Any:
    """The tokenizer from ``tokenizer`` (or ``model_dir``), local files only.

    Raises:
        ConfigError: If there is no tokenizer directory or its files do not load.
    """
    directory = options.tokenizer_dir
    if directory is None:
        raise _error(
            "tokenizer",
            "pre-training from a config needs a tokenizer: give a local tokenizer directory",
        )
    _quiet_transformers()
    from transformers import AutoTokenizer

    name = "tokenizer" if options.tokenizer is not None else "model_dir"
    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise _error(
            name, f"{directory}: no tokenizer loads from it ({' '.join(str(err).split())[:200]})"
        ) from None


def is_pretrained_model(model: nn.Module) -> bool:
    """Whether ``model`` is a ``transformers`` PreTrainedModel or a ``peft`` model of one.

    Never imports transformers: a model of it means it is imported already.
    """
    return any(cls.__name__ in ("PreTrainedModel", "PeftModel") for cls in type(model).__mro__)


def keep_only_trainable_in_state_dict(model: nn.Module) -> None:
    """Checkpoint only what trains: frozen parameters leave ``state_dict()``, and come back
    from the model itself on ``load_state_dict()`` (strict loading still checks the rest).

    For LoRA: the frozen base is read from its ``model_dir`` on every start, so saving it at
    every checkpoint would only cost time and disk.
    """

    def frozen(prefix: str) -> list[tuple[str, nn.Parameter]]:
        named = model.named_parameters(remove_duplicate=False)  # tied weights: both keys
        # checkpoint_wrapper's own hooks drop its prefix from the keys: drop it here too
        return [
            (prefix + name.replace("_checkpoint_wrapped_module.", ""), p)
            for name, p in named
            if not p.requires_grad
        ]

    def drop(module: nn.Module, state: dict[str, Any], prefix: str, *_: Any) -> None:
        for key, _p in frozen(prefix):
            state.pop(key, None)

    def refill(state: dict[str, Any], prefix: str, *_: Any) -> None:
        for key, p in frozen(prefix):
            state.setdefault(key, p.detach())

    model.register_state_dict_post_hook(drop)
    model.register_load_state_dict_pre_hook(lambda _m, state, prefix, *rest: refill(state, prefix))


def _add_lora(model: nn.Module, settings: Mapping[str, Any]) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    known = [f.name for f in dataclasses.fields(LoraConfig)]
    for key in settings:
        if key not in known:
            import difflib

            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise _error("lora", f"LoraConfig has no field '{key}'{hint}")
    try:
        config = LoraConfig(**{"task_type": "CAUSAL_LM", **settings})
        peft_model = get_peft_model(model, config)
    except (ValueError, TypeError) as err:
        raise _error("lora", " ".join(str(err).split())) from None
    keep_only_trainable_in_state_dict(peft_model)
    return peft_model


def _build_model(options: HFTaskOptions, config: Any) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model: Any
    dtype = DTYPES[options.dtype]
    kwargs: dict[str, Any] = {"dtype": dtype}
    if options.attn_implementation is not None:
        kwargs["attn_implementation"] = options.attn_implementation
    on_meta = torch.empty(0).device.type == "meta"  # plan/preflight: the structure only
    try:
        if options.model_dir is not None and not on_meta:
            model = AutoModelForCausalLM.from_pretrained(
                options.model_dir, config=config, local_files_only=True, **kwargs
            )
        else:
            model = AutoModelForCausalLM.from_config(config, **kwargs)
    except (ValueError, OSError, ImportError) as err:
        name = (
            "attn_implementation"
            if "attn" in str(err).lower()
            else ("model_dir" if options.model_dir is not None else "config")
        )
        raise _error(name, " ".join(str(err).split())[:400]) from None
    if options.lora is not None:
        model = _add_lora(model, options.lora)
    return model


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
    loads or initialises the model, ``build_data`` tokenizes the files once into the cache
    (or reads it) and returns packed windows.

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
        raise _error("block_size", f"{block} exceeds the model's context ({context} positions)")
    with meta_device():
        shape: Any = _build_model(opts, config)
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
        + f", windows of {block} tokens"
    )
    tokenizer_dir = opts.tokenizer_dir

    def build_model() -> nn.Module:
        return _build_model(opts, config)

    def build_data() -> Any:
        from gpu_training.tasks.hf_data import DataSpec, build_datasets

        if not opts.train_files:
            raise _error("train_files", "no training files: list .txt, .jsonl or .parquet files")
        tokenizer = load_tokenizer(opts)
        vocab = int(getattr(config, "vocab_size", 0) or 0)
        if vocab and len(tokenizer) > vocab:
            raise _error(
                "tokenizer",
                f"{tokenizer_dir}: {len(tokenizer)} tokens do not fit the model's vocab_size {vocab}",
            )
        fields: dict[str, Any] = {
            "text_field": opts.text_field,
            "prompt_field": opts.prompt_field,
            "response_field": opts.response_field,
        }
        train = DataSpec(tuple(Path(f) for f in opts.train_files), **fields)
        val = DataSpec(tuple(Path(f) for f in opts.val_files), **fields) if opts.val_files else None
        return build_datasets(
            train,
            val,
            tokenizer,
            block_size=block,
            val_fraction=float(opts.val_fraction),
            cache_dir=Path(opts.cache_dir or _DEFAULT_CACHE).expanduser(),
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
