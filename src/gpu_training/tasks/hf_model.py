"""The Hugging Face task's model and tokenizer, built from local files only.

:func:`hf_config` reads the model's config (``model_dir`` or ``config``), :func:`load_tokenizer`
the tokenizer, :func:`build_hf_model` the ``AutoModelForCausalLM`` (from the pretrained
weights, or initialised from the config; on ``meta`` for its shape), with ``peft``'s LoRA
adapters when asked. ``transformers`` and ``peft`` are imported when a model or tokenizer is
built, not before.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpu_training.tasks.hf_options import DTYPES, HFTaskOptions, option_error

__all__ = [
    "build_hf_model",
    "hf_config",
    "is_pretrained_model",
    "keep_only_trainable_in_state_dict",
    "load_tokenizer",
]


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
        raise option_error(
            where, f"not a usable model config: {' '.join(str(err).split())}"
        ) from None
    config.use_cache = False  # training: no key/value cache in the outputs
    return config


def load_tokenizer(options: HFTaskOptions) -> Any:
    """The tokenizer from ``tokenizer`` (or ``model_dir``), local files only.

    Raises:
        ConfigError: If there is no tokenizer directory or its files do not load.
    """
    directory = options.tokenizer_dir
    if directory is None:
        raise option_error(
            "tokenizer",
            "pre-training from a config needs a tokenizer: give a local tokenizer directory",
        )
    _quiet_transformers()
    from transformers import AutoTokenizer

    name = "tokenizer" if options.tokenizer is not None else "model_dir"
    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise option_error(
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
            raise option_error("lora", f"LoraConfig has no field '{key}'{hint}")
    try:
        config = LoraConfig(**{"task_type": "CAUSAL_LM", **settings})
        peft_model = get_peft_model(model, config)
    except (ValueError, TypeError) as err:
        raise option_error("lora", " ".join(str(err).split())) from None
    keep_only_trainable_in_state_dict(peft_model)
    return peft_model


def build_hf_model(options: HFTaskOptions, config: Any) -> nn.Module:
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
        raise option_error(name, " ".join(str(err).split())[:400]) from None
    if options.lora is not None:
        model = _add_lora(model, options.lora)
    return model
