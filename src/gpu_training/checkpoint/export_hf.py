"""Back to Hugging Face format: a checkpoint of any strategy to a ``from_pretrained`` directory.

``gpu-training ckpt export-hf CKPT OUT_DIR`` (or :func:`export_hf`) reads a checkpoint
written by a job whose model is a ``transformers`` model — the ``hf`` task, or a
``PreTrainedModel`` brought by an import string — and writes::

    OUT_DIR/config.json                   the model's config (architecture included)
    OUT_DIR/model.safetensors             weights (model-0000k-of-0000n.safetensors + an
                                          index when larger than max_shard_size)
    OUT_DIR/tokenizer.json ...            the tokenizer files the job trained with

so ``AutoModelForCausalLM.from_pretrained(OUT_DIR)`` gives the trained model's logits. The
checkpoint carries what this needs (its ``extra["hf"]``, written by the Trainer): no other
input. A LoRA checkpoint holds only the adapters; they are applied to the base read from the
``model_dir`` the job trained on (or ``base_dir``) and merged into it, or written as a
``peft`` adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``) with
``adapter=True``, which names its base portably (``base_name``, or the job's relative
``model_dir``): never by an absolute path of the exporting machine.

The checkpoint is verified and read as :func:`~gpu_training.checkpoint.consolidate` reads
it (``weights_only`` and allow-lists, DCP and DeepSpeed included); ``OUT_DIR`` is written
as a temporary directory beside it and renamed into place when complete.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gpu_training.checkpoint.files import CheckpointError
from gpu_training.checkpoint.formats import format_of
from gpu_training.checkpoint.offline import consolidate, read_manifest

__all__ = ["BaseNameWarning", "export_hf", "read_hf_checkpoint"]


class BaseNameWarning(UserWarning):
    """An adapter export named its base by the directory's name alone: pass ``base_name``."""


def read_hf_checkpoint(
    source: str | os.PathLike[str], *, trusted: bool = False
) -> tuple[Path, dict[str, torch.Tensor], dict[str, Any]]:
    """The full model state of a checkpoint and the Hugging Face entry of its extra state.

    Args:
        source: A step directory, or a checkpoint root (its newest committed checkpoint).
        trusted: Let a DeepSpeed checkpoint's reader unpickle without the allow-list.

    Returns:
        ``(step_dir, model_state, hf)``: keys without wrapper prefixes; ``hf`` holds
        ``config`` (JSON text), ``architecture``, ``tokenizer_files``, ``peft``, ``base_dir``.

    Raises:
        CheckpointError: If the checkpoint is missing or damaged, or was not written by a job
            whose model is a Hugging Face one.
    """
    step_dir, manifest = read_manifest(source)
    with tempfile.TemporaryDirectory(prefix="gpu-training-export-") as tmp:
        # consolidate verifies checksums and reads every format behind the allow-lists
        weights = consolidate(step_dir, Path(tmp) / "model.pt", trusted=trusted)
        model_state = torch.load(weights, map_location="cpu", weights_only=True)
    info = format_of(manifest).read_extra(step_dir).get("hf")
    if not isinstance(info, Mapping) or not isinstance(info.get("config"), str):
        raise CheckpointError(
            f"{step_dir} holds no Hugging Face model (no 'hf' entry in its extra state): only "
            "checkpoints of a job whose model is a transformers PreTrainedModel export; use "
            "'ckpt consolidate' for a plain state dict"
        )
    return step_dir, dict(model_state), dict(info)


def _check_out(out: Path, overwrite: bool, step_dir: Path) -> None:
    target = out.resolve()
    if target.is_relative_to(step_dir.resolve()) or target.is_relative_to(
        step_dir.parent.resolve()
    ):
        raise CheckpointError(
            f"{out} is inside the checkpoint directory {step_dir.parent}: write the export "
            "outside it"
        )
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out} is a file; expected a directory to create")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise CheckpointError(f"{out} exists and is not empty; pass --force to replace it")
    parent = out.resolve().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise CheckpointError(f"cannot write {out}: {parent} is not a writable directory")


def _config(info: Mapping[str, Any]) -> Any:
    from transformers import CONFIG_MAPPING

    data = json.loads(info["config"])
    model_type = data.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise CheckpointError(
            f"the checkpoint's model_type {model_type!r} is not known to the installed "
            "transformers: upgrade it to export this model"
        )
    return CONFIG_MAPPING[model_type].from_dict(data)


def _model_class(info: Mapping[str, Any]) -> Any:
    import transformers

    cls = getattr(transformers, str(info.get("architecture", "")), None)
    return cls if isinstance(cls, type) else transformers.AutoModelForCausalLM


def _plain_model(info: Mapping[str, Any], state: dict[str, torch.Tensor]) -> Any:
    config = _config(info)
    cls = _model_class(info)
    with torch.device("meta"):  # no initialisation: the weights come from the checkpoint
        model = cls.from_config(config) if cls.__name__.startswith("Auto") else cls(config)
    try:
        model.load_state_dict(state, assign=True)
    except RuntimeError as err:
        first = next((ln.strip() for ln in str(err).splitlines()[1:] if ln.strip()), str(err))
        raise CheckpointError(
            f"the checkpoint's weights do not fit its config: {first[:300]}"
        ) from None
    model.tie_weights()  # assign=True loaded tied weights as two tensors: tie them again
    return model


def _lora_base(info: Mapping[str, Any], base_dir: str | None) -> Path:
    base = base_dir or info.get("base_dir")
    if not base or not Path(base).is_dir():
        raise CheckpointError(
            f"the LoRA base {base!r} recorded in the checkpoint is not a directory: give the "
            "base model's directory with --base-dir"
        )
    return Path(base)


def _job_model_dir(manifest: Mapping[str, Any]) -> str | None:
    """The ``hf`` task's ``model_dir`` as the job file wrote it (the manifest's job)."""
    config = manifest.get("config")
    if not isinstance(config, Mapping) or not isinstance(config.get("task"), Mapping):
        return None
    options = config.get("task_options")
    if config["task"].get("name") != "hf" or not isinstance(options, Mapping):
        return None
    model_dir = options.get("model_dir")
    return model_dir if isinstance(model_dir, str) and model_dir else None


def _base_name(base: Path, typed: str | None) -> str:
    """What ``adapter_config.json`` names the base: no absolute path of this machine."""
    if typed is not None and not Path(typed).expanduser().is_absolute():
        return typed  # as the job file (or --base-dir) wrote it, resolved against nothing
    resolved, here = base.resolve(), Path.cwd().resolve()
    if resolved.is_relative_to(here):
        return resolved.relative_to(here).as_posix()
    warnings.warn(
        f"adapter_config.json names the base {resolved.name!r}, its directory's name ({base} "
        "lies outside the current directory): give --base-name a Hub id or the path the "
        "machine that loads the adapter finds the base at",
        BaseNameWarning,
        stacklevel=3,
    )
    return resolved.name


def _peft_model(
    info: Mapping[str, Any], state: dict[str, torch.Tensor], base: Path, name: str | None
) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    settings = json.loads(info["peft"])
    # the training's base path is not carried over: get_peft_model names the base it is given
    fields = {f for f in LoraConfig.__dataclass_fields__} - {"base_model_name_or_path"}
    config = LoraConfig(**{k: v for k, v in settings.items() if k in fields})
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True, dtype=torch.float32)
    if name is not None:  # peft records the name the base was loaded by, in both files it writes
        model.name_or_path = model.config.name_or_path = name
    peft_model = get_peft_model(model, config)
    wanted = {name for name, p in peft_model.named_parameters() if p.requires_grad}
    missing = sorted(wanted - set(state))
    unexpected = sorted(set(state) - set(peft_model.state_dict()))
    if missing or unexpected:
        what = f"lacks '{missing[0]}'" if missing else f"holds unknown '{unexpected[0]}'"
        raise CheckpointError(f"the checkpoint's adapters do not fit the base {base}: it {what}")
    peft_model.load_state_dict(state, strict=False)  # the base's own weights stay as loaded
    return peft_model


def export_hf(
    source: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    adapter: bool = False,
    base_dir: str | None = None,
    base_name: str | None = None,
    max_shard_size: str | int = "5GB",
    overwrite: bool = False,
    trusted: bool = False,
) -> Path:
    """Write a checkpoint's model as a Hugging Face ``from_pretrained`` directory.

    An adapter's ``adapter_config.json`` and model card name its base (what
    ``AutoPeftModelForCausalLM`` loads) never by an absolute path of this machine:
    ``base_name`` when given; else ``base_dir`` or the job's ``model_dir`` as written, when
    relative; else the base's path relative to the current directory, when below it; else
    its directory's name, with a :class:`BaseNameWarning`.

    Args:
        source: A step directory, or a checkpoint root (its newest committed checkpoint), of
            any strategy (plain, FSDP/DCP, DeepSpeed).
        out_dir: The directory to write (created; must be empty unless ``overwrite``).
        adapter: LoRA: write the adapter (``peft`` format) instead of the merged model.
        base_dir: LoRA: the base model's directory (default: the one the job trained on).
        base_name: With ``adapter``: what ``adapter_config.json`` names the base, as given —
            a Hub id or the path on the machine that will load the adapter.
        max_shard_size: Largest safetensors file (``"5GB"``, bytes); larger models are sharded
            with an index.
        overwrite: Replace ``out_dir`` if it holds files.
        trusted: Let a DeepSpeed checkpoint's reader unpickle without the allow-list.

    Returns:
        ``out_dir`` as a ``Path``.

    Raises:
        ValueError: If ``base_name`` is empty or given without ``adapter``.
        CheckpointError: If the checkpoint is missing, damaged or not a Hugging Face model's;
            ``out_dir`` is not writable, not empty or inside the checkpoint; ``adapter`` is
            asked of a model without adapters; or the LoRA base is missing.
    """
    if base_name is not None and not adapter:
        raise ValueError("--base-name names the base in adapter_config.json: it needs --adapter")
    if base_name is not None and not base_name.strip():
        raise ValueError("--base-name: expected a Hub id or a path, got an empty name")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out = Path(out_dir)
    step_dir, manifest = read_manifest(source)
    _check_out(out, overwrite, step_dir)
    step_dir, state, info = read_hf_checkpoint(step_dir, trusted=trusted)
    lora = isinstance(info.get("peft"), str)
    if adapter and not lora:
        raise CheckpointError(f"{step_dir}: --adapter needs a LoRA checkpoint; this one has none")
    tmp = out.resolve().parent / f".{out.name}.tmp-{secrets.token_hex(4)}"
    try:
        if lora:
            base = _lora_base(info, base_dir)
            recorded = None
            if adapter:
                typed = base_dir if base_dir is not None else _job_model_dir(manifest)
                recorded = base_name if base_name is not None else _base_name(base, typed)
            peft_model = _peft_model(info, state, base, recorded)
            if adapter:
                # the base is never resized; "auto" would look its name up on the Hub
                peft_model.save_pretrained(tmp, save_embedding_layers=False)
            else:
                merged = peft_model.merge_and_unload()
                merged.config.use_cache = True
                merged.save_pretrained(tmp, max_shard_size=max_shard_size)
        else:
            model = _plain_model(info, state)
            model.config.use_cache = True  # the checkpoint trained without it; inference wants it
            model.save_pretrained(tmp, max_shard_size=max_shard_size)
        files = info.get("tokenizer_files") or {}
        for name, data in files.items():
            if Path(name).name != name or name.startswith("."):  # a hostile name stays inside
                raise CheckpointError(
                    f"{step_dir}: tokenizer file name {name!r} is not a plain name"
                )
            (tmp / name).write_bytes(bytes(data.numpy().tobytes()))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
