"""``gpu-training ckpt inspect | verify | consolidate | export-hf``: checkpoints offline.

A checkpoint is data: ``inspect`` and ``verify`` unpickle nothing; ``consolidate`` and
``export-hf`` read behind the allow-lists of :mod:`gpu_training.checkpoint.safe_load`.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpu_training.cli import UsageError
from gpu_training.commands.argtypes import (
    add_trust_argument,
)

__all__ = ["register"]


_EXIT_CORRUPT = 1


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "ckpt",
        help="inspect, verify, consolidate or export checkpoints",
        description=(
            "Work with checkpoint directories written by CheckpointManager (plain, sharded or "
            "DeepSpeed). DIR is a checkpoint root (its newest committed step is used) or one "
            "step-XXXXXXXX directory. A checkpoint is data: nothing in it is unpickled beyond "
            "torch's weights_only allow-list, its files never point outside it, and inspect "
            "and verify unpickle nothing at all."
        ),
    )
    actions = parser.add_subparsers(title="actions", dest="ckpt_action", metavar="ACTION")
    actions.required = True
    inspect = actions.add_parser(
        "inspect",
        help="print a checkpoint's manifest",
        description="Print the manifest of DIR's newest checkpoint (or of the step DIR names).",
    )
    inspect.add_argument("dir", metavar="DIR", help="checkpoint root or step directory")
    inspect.add_argument("--json", action="store_true", help="print the manifest as JSON")
    inspect.set_defaults(_run=_run_ckpt_inspect)
    verify = actions.add_parser(
        "verify",
        help="check sizes and checksums (exit 1 on corruption)",
        description=(
            "Check every file of every step directory under DIR (or of the step DIR names) "
            "against its manifest: presence, size and checksum. Exit code 1 if any is damaged."
        ),
    )
    verify.add_argument("dir", metavar="DIR", help="checkpoint root or step directory")
    verify.set_defaults(_run=_run_ckpt_verify)
    consolidate = actions.add_parser(
        "consolidate",
        help="write one .safetensors or .pt file that loads into an unwrapped model",
        description=(
            "Verify DIR's newest checkpoint (or the step DIR names), sharded or plain, and "
            "write its model weights to OUT: .safetensors, or .pt/.pth (torch.save of a plain "
            "state dict, loadable with weights_only=True). Written atomically."
        ),
    )
    consolidate.add_argument("dir", metavar="DIR", help="checkpoint root or step directory")
    consolidate.add_argument("out", metavar="OUT", help="output file (.safetensors, .pt, .pth)")
    consolidate.add_argument(
        "--include-optimizer",
        action="store_true",
        help="also write the optimizer and extra state (.pt only): {model_state, ...}",
    )
    consolidate.add_argument("--force", action="store_true", help="replace OUT if it exists")
    add_trust_argument(consolidate)
    consolidate.set_defaults(_run=_run_ckpt_consolidate)
    export = actions.add_parser(
        "export-hf",
        help="write a Hugging Face from_pretrained directory (config, safetensors, tokenizer)",
        description=(
            "Verify DIR's newest checkpoint (or the step DIR names) of a job whose model is a "
            "Hugging Face one (task hf, or a PreTrainedModel import string), any strategy, and "
            "write OUT_DIR: config.json, safetensors weights (sharded when larger than "
            "--max-shard-size) and the tokenizer files, so "
            "AutoModelForCausalLM.from_pretrained(OUT_DIR) loads it. A LoRA checkpoint is "
            "merged into its base, or written as a peft adapter with --adapter."
        ),
    )
    export.add_argument("dir", metavar="CKPT", help="checkpoint root or step directory")
    export.add_argument("out", metavar="OUT_DIR", help="directory to write (empty or new)")
    export.add_argument(
        "--adapter", action="store_true", help="LoRA: write the adapter, not the merged model"
    )
    export.add_argument(
        "--base-dir", metavar="DIR", help="LoRA: the base model (default: the job's model_dir)"
    )
    export.add_argument(
        "--base-name",
        metavar="NAME",
        help=(
            "with --adapter: the base that adapter_config.json names, as given: a Hub id or the "
            "path on the machine that loads it (default: the job's model_dir when relative, "
            "else a path relative to here or the base's directory name)"
        ),
    )
    export.add_argument(
        "--max-shard-size", default="5GB", metavar="SIZE", help="largest weights file (5GB)"
    )
    export.add_argument("--force", action="store_true", help="replace OUT_DIR if not empty")
    add_trust_argument(export)
    export.set_defaults(_run=_run_ckpt_export_hf)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _layout(layout: dict[str, int]) -> str:
    ranks = layout["world_size"]
    return (
        f"{ranks} rank{'s' if ranks != 1 else ''} x {layout['per_device_batch_size']} per device "
        f"x {layout['gradient_accumulation_steps']} accumulation = global batch "
        f"{layout['global_batch_size']}"
    )


def _run_ckpt_inspect(args: argparse.Namespace) -> int:
    import json

    from gpu_training.checkpoint import CheckpointError, format_of, read_manifest, run_layout

    try:
        step_dir, manifest = read_manifest(args.dir)
    except CheckpointError as err:
        raise UsageError(f"ckpt inspect: {err}") from None
    if args.json:
        print(json.dumps({"path": str(step_dir), "manifest": manifest}, indent=2))
        return 0
    files = manifest["files"]
    layout = run_layout(manifest)  # none for a hand-written loop's checkpoint
    rows = [
        ("checkpoint", str(step_dir)),
        ("step", str(manifest["step"])),
        ("format", format_of(manifest).label),
        ("world size", str(manifest.get("world_size", "?"))),
        *([("layout", _layout(layout))] if layout is not None else []),
        ("created", str(manifest.get("created", "?"))),
        ("torch", str(manifest.get("torch_version", "?"))),
        ("config hash", str(manifest.get("config_hash") or "-")),
    ]
    if manifest.get("metadata"):
        rows.append(("metadata", json.dumps(manifest["metadata"], sort_keys=True)))
    rows.append(("files", f"{len(files)}, {_size(sum(f['size'] for f in files))}"))
    lines = [f"{name:<12} {value}" for name, value in rows]
    width = max(len(f["name"]) for f in files)
    lines += [f"  {f['name']:<{width}}  {_size(f['size']):>10}  {f['checksum']}" for f in files]
    print("\n".join(lines))
    return 0


def _run_ckpt_verify(args: argparse.Namespace) -> int:
    from gpu_training.checkpoint import CheckpointError, verify_checkpoints

    try:
        results = verify_checkpoints(args.dir)
    except CheckpointError as err:
        raise UsageError(f"ckpt verify: {err}") from None
    lines = []
    for step_dir, problems in results.items():
        if problems:
            lines.append(f"{step_dir.name}  CORRUPT")
            lines += [f"  {problem}" for problem in problems]
        else:
            lines.append(f"{step_dir.name}  OK")
    bad = sum(1 for problems in results.values() if problems)
    lines.append(f"{len(results)} checked: {len(results) - bad} OK, {bad} corrupt")
    print("\n".join(lines))
    return _EXIT_CORRUPT if bad else 0


def _run_ckpt_consolidate(args: argparse.Namespace) -> int:
    from gpu_training.checkpoint import CheckpointError, consolidate, read_manifest

    try:
        step_dir, _ = read_manifest(args.dir)
        out = consolidate(
            step_dir,
            args.out,
            include_optimizer=args.include_optimizer,
            overwrite=args.force,
            trusted=args.trust_checkpoint,
        )
    except (CheckpointError, ValueError) as err:
        raise UsageError(f"ckpt consolidate: {err}") from None
    except ImportError as err:
        raise UsageError(f"ckpt consolidate: {err} (pip install safetensors)") from None
    print(f"wrote {out} ({_size(out.stat().st_size)}) from {step_dir}")
    return 0


def _run_ckpt_export_hf(args: argparse.Namespace) -> int:
    import warnings

    from gpu_training.checkpoint import CheckpointError, read_manifest

    try:
        step_dir, _ = read_manifest(args.dir)
        from gpu_training.checkpoint.export_hf import BaseNameWarning, export_hf

        with warnings.catch_warnings(record=True) as caught:
            out = export_hf(
                step_dir,
                args.out,
                adapter=args.adapter,
                base_dir=args.base_dir,
                base_name=args.base_name,
                max_shard_size=args.max_shard_size,
                overwrite=args.force,
                trusted=args.trust_checkpoint,
            )
    except (CheckpointError, ValueError) as err:
        raise UsageError(f"ckpt export-hf: {' '.join(str(err).split())}") from None
    except ImportError as err:
        raise UsageError(f"ckpt export-hf: {err} (pip install 'gpu-training[hf]')") from None
    notes = []
    for caught_warning in caught:  # ours become one line; the libraries' show as they would
        if issubclass(caught_warning.category, BaseNameWarning):
            notes.append(f"note: {caught_warning.message}")
        else:
            warnings.showwarning(
                caught_warning.message,
                caught_warning.category,
                caught_warning.filename,
                caught_warning.lineno,
            )
    files = sorted(p.name for p in out.iterdir())
    print("\n".join([f"wrote {out} from {step_dir}: {', '.join(files)}", *notes]))
    return 0
