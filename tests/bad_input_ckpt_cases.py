"""Bad-input cases of checkpoints (see ``bad_input_table.py``): damaged, hostile, lying.

- checkpoints damaged five ways (truncated file, flipped byte, missing listed file, missing
  or garbage manifest), every format, under ``ckpt inspect | verify | consolidate``,
  ``train`` resuming and the Python API (``CheckpointManager.load`` / ``load_sharded``);
- pickle payloads in every file of every format (plain, DCP, DeepSpeed, a consolidated
  ``.pt``), their manifests vouching for them, and manifests that lie about the format;
- links and ``..``: a checkpoint's files (and DCP's index) never lead out of it.

``ckpt inspect`` and ``ckpt verify`` open no pickle: on a hostile checkpoint whose manifest
vouches for every file they report it as they find it (exit 0), and the payload never runs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from bad_input_kit import (
    DAMAGES,
    FORMATS,
    SOURCE_JOB,
    STEPS,
    Sandbox,
    job_dict,
    poison_distcp,
    poison_metadata,
    poison_pt,
    redirect_distcp,
    set_manifest,
    vouch,
)
from bad_input_table import Action, argv, case, then

NEWEST = STEPS[-1]

# ----------------------------------------------------------------------------------------------
# what is run on a prepared checkpoint root (sb.ckroot)


def inspect(sb: Sandbox) -> list[str]:
    return argv("ckpt", "inspect", sb.ckroot)


def verify(sb: Sandbox) -> list[str]:
    return argv("ckpt", "verify", sb.ckroot)


def consolidate(sb: Sandbox) -> list[str]:
    return argv("ckpt", "consolidate", sb.ckroot, sb.root / "model.pt")


def on_step(command: str) -> Callable[[Sandbox], list[str]]:
    """``ckpt COMMAND`` on the newest step directory (not the root, which falls back)."""

    def run(sb: Sandbox) -> list[str]:
        out = [sb.root / "model.pt"] if command == "consolidate" else []
        return argv("ckpt", command, sb.step(), *out)

    return run


def train_args(
    sb: Sandbox, fmt: str, *extra: str, changes: dict[str, object] | None = None
) -> list[str]:
    """``train`` resuming the sandbox's checkpoints with the ``fmt`` job, on 2 ranks."""
    return argv("train", sb.job(fmt, changes), "--nproc", "2", *extra)


def train(fmt: str, *extra: str) -> Callable[[Sandbox], list[str]]:
    return lambda sb: train_args(sb, fmt, *extra)


def load_api(fmt: str, *, newest: bool = False) -> Callable[[Sandbox], Action]:
    """``CheckpointManager.load`` (``load_sharded(model, optimizer)`` for ``dcp``) of the
    newest step by name, or (``newest``) of the newest that verifies, as a resume picks it."""

    def run(sb: Sandbox) -> Action:
        import torch

        from gpu_training.checkpoint import CheckpointManager
        from gpu_training.ddp import DistributedContext
        from gpu_training.tasks import resolve_task

        manager = CheckpointManager(sb.ckroot, ctx=DistributedContext())
        step = None if newest else sb.step()
        if fmt != "dcp":
            return lambda: manager.load(step)
        model = resolve_task("charlm", dict(SOURCE_JOB["task_options"])).build_model()
        optimizer = torch.optim.AdamW(model.parameters())  # its state is read too
        return lambda: manager.load_sharded(model, optimizer, step)

    return run


# ----------------------------------------------------------------------------------------------
# damaged five ways, every step of every format

_MAIN_FILE = {"plain": "state.pt", "dcp": "__0_0.distcp", "deepspeed": "mp_rank_00_model_states.pt"}
_DAMAGE_WORDS = {
    "truncated": "truncated",
    "flipped-byte": "checksum mismatch",
    "missing-file": "missing",
    "missing-manifest": "manifest.json",
    "garbage-manifest": "manifest.json",
}


def damaged(fmt: str, how: str) -> Callable[[Sandbox], None]:
    def build(sb: Sandbox) -> None:
        root = sb.checkpoint(fmt)
        for step in STEPS:
            DAMAGES[how](root / step / _MAIN_FILE[fmt])

    return build


for _fmt in FORMATS:
    for _how, _word in _DAMAGE_WORDS.items():
        _setup = damaged(_fmt, _how)
        _id = f"{_fmt}/{_how}"
        if _how == "flipped-byte":  # inspect checks sizes, never hashes: it prints the manifest
            case(f"ckpt-inspect/{_id}", then(_setup, inspect), NEWEST, code=0, stream="stdout")
        else:
            case(f"ckpt-inspect/{_id}", then(_setup, inspect), "none of its 2", NEWEST, _word)
        case(
            f"ckpt-verify/{_id}",
            then(_setup, verify),
            f"{STEPS[0]}  CORRUPT",
            f"{NEWEST}  CORRUPT",
            _word,
            "2 corrupt",
            code=1,
            stream="stdout",
        )
        case(f"ckpt-consolidate/{_id}", then(_setup, consolidate), NEWEST, _word)
        case(
            f"train/{_id}",
            then(_setup, train(_fmt)),
            "2 damaged checkpoint(s)",
            STEPS[0],
            NEWEST,
            "never overwritten",
            "mkdir -p",
            "&& mv",
            _word,
            row="all-truncated-restart-at-0"
            if _how == "truncated"
            else "malicious-or-corrupt-resume",
        )
        if _fmt != "deepspeed":  # load_deepspeed needs an engine on every rank: DeepSpeed's
            case(
                f"api-load/{_id}",
                then(_setup, load_api(_fmt, newest=True)),
                NEWEST,
                _word,
            )


# ----------------------------------------------------------------------------------------------
# pickle payloads in every file of every format, their manifests vouching for them

_POISONABLE: dict[str, tuple[str, ...]] = {
    "plain": ("state.pt",),
    "dcp": (".metadata", "extra.pt", "__0_0.distcp", "__1_0.distcp"),
    "deepspeed": (
        "mp_rank_00_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
        "extra.pt",
    ),
}
_TRUST = "--trust-checkpoint"
"""The hint a refusal gives where trusting the checkpoint would let its reader through: only
DeepSpeed's readers (plain and sharded files are read with weights_only whatever the trust)."""


def poisoned(fmt: str, name: str) -> Callable[[Sandbox], None]:
    """The ``fmt`` checkpoints with a payload in the newest step's ``name``, vouched for."""

    def build(sb: Sandbox) -> None:
        step = sb.checkpoint(fmt) / NEWEST
        if name == ".metadata":
            poison_metadata(step, sb.marker)
            vouch(step, name)
        elif name.endswith(".distcp"):
            sb.expect(poison_distcp(step, name, sb.marker))  # the value now read from it
            vouch(step, name, ".metadata")
            return  # its file: named by the CLI (see below), not by load_sharded
        else:
            poison_pt(step / name, sb.marker)
            vouch(step, name)
        sb.expect(name)

    return build


for _fmt, _names in _POISONABLE.items():
    _reject = () if _fmt == "deepspeed" else (_TRUST,)
    for _name in _names:
        _setup = poisoned(_fmt, _name)
        _id = f"{_fmt}/{_name}"
        case(f"ckpt-inspect/payload/{_id}", then(_setup, inspect), NEWEST, code=0, stream="stdout")
        case(
            f"ckpt-verify/payload/{_id}",
            then(_setup, verify),
            f"{NEWEST}  OK",
            code=0,
            stream="stdout",
        )
        case(
            f"ckpt-consolidate/payload/{_id}",
            then(_setup, consolidate),
            "refused",
            _name,
            reject=_reject,
            row="ds-manifest-runs-payload" if _fmt == "deepspeed" else None,
        )
        case(
            f"train/payload/{_id}",
            then(_setup, train(_fmt)),
            "refused",
            NEWEST,
            _name,
            reject=_reject,
            row="malicious-or-corrupt-resume",
        )
        if _fmt != "deepspeed":
            case(f"api-load/payload/{_id}", then(_setup, load_api(_fmt)), "refused", reject=_reject)


def _consolidated(sb: Sandbox, *, named: bool = True) -> Path:
    """A payload-laden consolidated ``.pt`` (as ``ckpt consolidate`` writes it) at sb.root."""
    from gpu_training.checkpoint import consolidate as write

    source = sb.source_run("plain") / "checkpoints"
    out = write(source, sb.root / "model.pt", include_optimizer=True)
    poison_pt(out, sb.marker)
    if named:
        sb.expect("model.pt")
    return out


def _load_plain(sb: Sandbox) -> Action:
    from gpu_training.checkpoint import load_plain

    file = _consolidated(sb)
    return lambda: load_plain(file)


def _consolidated_as_state(sb: Sandbox) -> None:
    """A plain checkpoint whose state.pt is a payload-laden consolidated file, vouched for."""
    step = sb.checkpoint("plain") / NEWEST
    shutil.copyfile(_consolidated(sb, named=False), step / "state.pt")
    (sb.root / "model.pt").unlink()
    vouch(step, "state.pt")
    sb.expect("state.pt")


_NOT_A_DIR = "no such checkpoint directory"
case(
    "ckpt-inspect/payload/consolidated.pt",
    lambda sb: argv("ckpt", "inspect", _consolidated(sb)),
    _NOT_A_DIR,
)
case(
    "ckpt-verify/payload/consolidated.pt",
    lambda sb: argv("ckpt", "verify", _consolidated(sb)),
    _NOT_A_DIR,
)
case(
    "ckpt-consolidate/payload/consolidated.pt",
    lambda sb: argv("ckpt", "consolidate", _consolidated(sb), sb.root / "out.pt"),
    _NOT_A_DIR,
)
case(
    "api-load-plain/payload/consolidated.pt",
    _load_plain,
    "refused",
    "posix.system",
    reject=(_TRUST,),
)
case(
    "ckpt-consolidate/payload/consolidated-as-state.pt",
    then(_consolidated_as_state, consolidate),
    "refused",
)
case(
    "train/payload/consolidated-as-state.pt",
    then(_consolidated_as_state, train("plain")),
    "refused",
)
case(
    "api-load/payload/consolidated-as-state.pt",
    then(_consolidated_as_state, load_api("plain")),
    "refused",
)


# manifests that lie about their format, over payload-laden files
_OPTIM = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
_LIES: dict[str, tuple[str, str]] = {
    "deepspeed-over-plain": ("deepspeed", _OPTIM),  # issue 13's: a clean state.pt, a payload beside
    "dcp-over-plain": ("dcp", ".metadata"),
    "unknown-format": ("plain", "state.pt"),  # whatever reader it falls back to must refuse
}
"""Lie -> (the format whose job the manifest claims, the file holding the payload)."""


def lying(kind: str) -> Callable[[Sandbox], None]:
    """A plain checkpoint whose manifest lies about its format (and claims the job's settings:
    whoever writes the manifest can), with a payload in the file that format's reader opens."""

    def build(sb: Sandbox) -> None:
        from gpu_training.job import JobConfig

        step = sb.checkpoint("plain") / NEWEST
        claimed, payload = _LIES[kind]
        if kind == "deepspeed-over-plain":
            shutil.copyfile(step / "state.pt", step / _OPTIM)
            poison_pt(step / _OPTIM, sb.marker)
        elif kind == "dcp-over-plain":
            shutil.copyfile(
                sb.source_run("dcp") / "checkpoints" / NEWEST / ".metadata", step / ".metadata"
            )
            poison_metadata(step, sb.marker)
        else:
            poison_pt(step / "state.pt", sb.marker)
        vouch(step, payload)
        job = JobConfig.from_dict(job_dict(claimed, sb.out))
        set_manifest(
            step,
            state_format={"deepspeed": "deepspeed", "dcp": "dcp"}.get(claimed, "pickle"),
            config=json.loads(json.dumps(job.to_dict(), default=str)),
            config_hash=job.config_hash(),
            world_size=2,
        )

    return build


for _lie, (_claimed, _payload) in _LIES.items():
    _setup = lying(_lie)
    _row = "ds-manifest-runs-payload" if _lie == "deepspeed-over-plain" else None
    _unknown = _lie == "unknown-format"
    case(
        f"ckpt-inspect/lie/{_lie}", then(_setup, inspect), NEWEST, code=0, stream="stdout", row=_row
    )
    case(
        f"ckpt-verify/lie/{_lie}",
        then(_setup, verify),
        f"{NEWEST}  OK",
        code=0,
        stream="stdout",
        row=_row,
    )
    case(f"ckpt-consolidate/lie/{_lie}", then(_setup, consolidate), "refused", _payload, row=_row)
    case(
        f"train/lie/{_lie}",
        then(_setup, train(_claimed)),
        *((NEWEST, "pickle checkpoint") if _unknown else ("refused", _payload)),
        row=_row,
        needs="deepspeed" if _claimed == "deepspeed" else None,
    )
    case(f"train-ddp/lie/{_lie}", then(_setup, train("plain")), NEWEST)
    # load() reads state.pt with weights_only=True: a clean one loads, whatever the manifest
    case(
        f"api-load/lie/{_lie}",
        then(_setup, load_api("plain")),
        *(("refused", "state.pt") if _unknown else ()),
        code=2 if _unknown else 0,
        stream="stderr" if _unknown else "stdout",
    )
    case(
        f"api-load-sharded/lie/{_lie}",
        then(_setup, load_api("dcp")),
        *(("refused", ".metadata") if _lie == "dcp-over-plain" else (NEWEST,)),
    )


# ----------------------------------------------------------------------------------------------
# symbolic links and `..`: a checkpoint's files never lead out of it


def symlinked(fmt: str) -> Callable[[Sandbox], None]:
    """The newest step's main file replaced by a link to the same file, moved outside."""

    def build(sb: Sandbox) -> None:
        file = sb.checkpoint(fmt) / NEWEST / _MAIN_FILE[fmt]
        outside = sb.root / "outside" / file.name
        outside.parent.mkdir()
        shutil.move(file, outside)
        file.symlink_to(outside)  # sizes and checksums match: only the link gives it away
        sb.expect("symbolic link")

    return build


for _fmt in FORMATS:
    _setup = symlinked(_fmt)
    _row = "symlinked-state-copied" if _fmt == "plain" else None
    case(f"ckpt-inspect/symlink/{_fmt}", then(_setup, on_step("inspect")), NEWEST, row=_row)
    case(
        f"ckpt-verify/symlink/{_fmt}",
        then(_setup, verify),
        f"{NEWEST}  CORRUPT",
        code=1,
        stream="stdout",
        row=_row,
    )
    case(f"ckpt-consolidate/symlink/{_fmt}", then(_setup, on_step("consolidate")), NEWEST, row=_row)
    case(f"train/symlink/{_fmt}", then(_setup, train(_fmt)), NEWEST, "mkdir -p", row=_row)
    if _fmt != "deepspeed":
        case(f"api-load/symlink/{_fmt}", then(_setup, load_api(_fmt)), NEWEST, row=_row)


def _manifest_link(sb: Sandbox) -> None:
    manifest = sb.checkpoint("plain") / NEWEST / "manifest.json"
    outside = sb.root / "outside-manifest.json"
    shutil.move(manifest, outside)
    manifest.symlink_to(outside)
    sb.expect("manifest.json", "symbolic link")


case("ckpt-inspect/symlink/manifest", then(_manifest_link, on_step("inspect")))
case(
    "ckpt-verify/symlink/manifest",
    then(_manifest_link, verify),
    f"{NEWEST}  CORRUPT",
    code=1,
    stream="stdout",
)
case("ckpt-consolidate/symlink/manifest", then(_manifest_link, on_step("consolidate")))
case("train/symlink/manifest", then(_manifest_link, train("plain")), "mkdir -p")
case("api-load/symlink/manifest", then(_manifest_link, load_api("plain")))


def dotdot(name: str) -> Callable[[Sandbox], None]:
    """The newest step's manifest naming ``name`` (out of the step directory) for state.pt."""

    def build(sb: Sandbox) -> None:
        step = sb.checkpoint("plain") / NEWEST
        shutil.copyfile(step / "state.pt", sb.root / "outside.pt")
        manifest = json.loads((step / "manifest.json").read_text())
        manifest["files"][0]["name"] = name
        (step / "manifest.json").write_text(json.dumps(manifest))
        sb.expect("manifest.json", "bad file entry")

    return build


for _label, _name in (
    ("dotdot", "../../../outside.pt"),
    ("dotdot-bare", ".."),
    ("absolute", "/etc/passwd"),
):
    _setup = dotdot(_name)
    case(f"ckpt-inspect/{_label}", then(_setup, on_step("inspect")))
    case(
        f"ckpt-verify/{_label}", then(_setup, verify), f"{NEWEST}  CORRUPT", code=1, stream="stdout"
    )
    case(f"ckpt-consolidate/{_label}", then(_setup, on_step("consolidate")))
    case(f"train/{_label}", then(_setup, train("plain")), "mkdir -p")
    case(f"api-load/{_label}", then(_setup, load_api("plain")))


def _dcp_reads_outside(sb: Sandbox) -> None:
    """A DCP checkpoint whose (vouched) ``.metadata`` stores its values in a file outside."""
    step = sb.checkpoint("dcp") / NEWEST
    shutil.copyfile(step / "__0_0.distcp", sb.root / "outside.distcp")
    redirect_distcp(step, "__0_0.distcp", "../../../outside.distcp")
    vouch(step, ".metadata")
    sb.expect("outside.distcp")


case(
    "ckpt-consolidate/dcp-index-reads-outside",
    then(_dcp_reads_outside, consolidate),
    "not a file of this checkpoint",
)
case(
    "train/dcp-index-reads-outside",
    then(_dcp_reads_outside, train("dcp")),
    "not a file of this checkpoint",
    NEWEST,
)
# the Python API's refusals, read by whoever calls it
_ADVICE = "will likely succeed"
"""torch's advice on a refused pickle: re-run with weights_only=False."""
case(
    "api-load/refusal-quotes-torch-advice",
    then(poisoned("plain", "state.pt"), load_api("plain")),
    "refused",
    reject=(_ADVICE,),
)
case(
    "api-load-sharded/refusal-names-the-file",
    then(poisoned("dcp", "__0_0.distcp"), load_api("dcp")),
    "refused",
    "__0_0.distcp",
    reject=(_ADVICE,),
)
case(
    "api-load-sharded/dcp-index-reads-outside",
    then(_dcp_reads_outside, load_api("dcp")),
    NEWEST,
)
