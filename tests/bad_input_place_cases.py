"""Bad-input cases of places and resumes (see ``bad_input_table.py``).

- places that cannot be written: under a regular file, a read-only mount, a full disk (a
  600 KiB tmpfs: one checkpoint fits, the second does not), an output inside the checkpoint
  it reads; ``ckpt`` directories that are missing, a file, empty;
- bad input only the ranks can see (after torchrun started);
- resuming with changed settings: refused naming ``field: old -> new`` and
  ``--allow-config-change``; another model shape, strategy or global batch.

The mount cases skip themselves where this machine cannot mount a tmpfs.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bad_input_ckpt_cases import NEWEST, train, train_args
from bad_input_kit import FORMATS, STEPS, Sandbox, mount_tmpfs, remount_read_only
from bad_input_table import Proc, argv, case, command, then

# ----------------------------------------------------------------------------------------------
# unwritable places


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _under_file(field: str) -> Callable[[Sandbox], list[str]]:
    def build(sb: Sandbox) -> list[str]:
        blocker = sb.write("afile", "not a directory\n")
        sb.expect(field, "afile")
        return train_args(sb, "plain", changes={field: str(blocker / "sub" / "dir")})

    return build


_ROW = "ckpt-dir-read-only-or-under-file"
case("train/checkpoint-dir-under-a-file", _under_file("checkpoint.dir"), "under a file", row=_ROW)
case("train/output-dir-under-a-file", _under_file("run.output_dir"), "under a file", row=_ROW)
case(
    "train/checkpoint-dir-is-a-file",
    lambda sb: train_args(sb, "plain", changes={"checkpoint.dir": str(sb.write("afile", "x"))}),
    "checkpoint.dir",
    "is a file",
    row=_ROW,
)
case(
    "train-1-rank/checkpoint-dir-under-a-file",
    lambda sb: argv("train", sb.job("plain", {"checkpoint.dir": str(sb.write("f", "x") / "c")})),
    "checkpoint.dir",
    "under a file",
    row=_ROW,
)


def _read_only_mount(sb: Sandbox, *, with_checkpoint: bool, named: bool = True) -> Path:
    """A small tmpfs at ``sb.root/ro``, read-only (with a copy of the plain checkpoints)."""
    mount = sb.enter(mount_tmpfs(sb.root / "ro", "8m"))
    if with_checkpoint:
        shutil.copytree(sb.source_run("plain") / "checkpoints", mount / "checkpoints")
    remount_read_only(mount)
    if named:
        sb.expect("read-only")
    return mount


case(
    "train/checkpoint-dir-read-only",
    lambda sb: train_args(
        sb,
        "plain",
        changes={"checkpoint.dir": str(_read_only_mount(sb, with_checkpoint=True) / "checkpoints")},
    ),
    "checkpoint.dir",
    row=_ROW,
)
case(
    "train/output-dir-read-only",
    lambda sb: train_args(
        sb,
        "plain",
        changes={"run.output_dir": str(_read_only_mount(sb, with_checkpoint=False) / "out")},
    ),
    "run.output_dir",
    row=_ROW,
)
case(
    "ckpt-consolidate/out-read-only",
    lambda sb: argv(
        "ckpt",
        "consolidate",
        sb.checkpoint("plain"),
        _read_only_mount(sb, with_checkpoint=False, named=False) / "m.pt",
    ),
    "m.pt",
    "not a writable directory",
)


def _consolidate_to(
    out: Callable[[Sandbox], Path], *extra: str, source: str = ""
) -> Callable[[Sandbox], list[str]]:
    """``ckpt consolidate`` of the plain checkpoints (or ``source`` under them) into ``out``."""

    def run(sb: Sandbox) -> list[str]:
        root = sb.checkpoint("plain")
        return argv("ckpt", "consolidate", root / source if source else root, out(sb), *extra)

    return run


def _checkpoint(fmt: str) -> Callable[[Sandbox], Path]:
    return lambda sb: sb.checkpoint(fmt)


def _in_step(name: str, sb: Sandbox) -> Path:
    return sb.step() / name


def _out(sb: Sandbox) -> Path:
    return sb.root / "m.pt"


_OWN = "consolidate-into-own-step"
for _fmt, _inside in (("plain", "state.pt"), ("dcp", "extra.pt"), ("deepspeed", "extra.pt")):
    case(
        f"ckpt-consolidate/out-is-{_inside}/{_fmt}",
        command("ckpt", "consolidate", _checkpoint(_fmt), partial(_in_step, _inside), "--force"),
        "inside the checkpoint",
        NEWEST,
        row=_OWN,
    )
case(
    "ckpt-consolidate/out-new-file-in-step",
    _consolidate_to(lambda sb: sb.step() / "m.pt"),
    "inside the checkpoint",
    row=_OWN,
)
case(
    "ckpt-consolidate/out-in-another-step",
    _consolidate_to(lambda sb: sb.step(STEPS[0]) / "m.pt", "--force", source=NEWEST),
    "inside the checkpoint",
    STEPS[0],
    row=_OWN,
)
case(
    "ckpt-consolidate/out-is-step-dir",
    _consolidate_to(lambda sb: sb.step(), "--force"),
    NEWEST,
    "unknown output type",
)
case(
    "ckpt-consolidate/out-bad-suffix",
    _consolidate_to(lambda sb: sb.root / "m.txt"),
    "m.txt",
    ".safetensors",
)
case(
    "ckpt-consolidate/optimizer-into-safetensors",
    _consolidate_to(lambda sb: sb.root / "m.safetensors", "--include-optimizer"),
    "m.safetensors",
    ".pt",
)
case(
    "ckpt-consolidate/out-exists",
    _consolidate_to(lambda sb: sb.write("m.pt", "mine")),
    "m.pt",
    "--force",
)
case(
    "ckpt-consolidate/out-is-a-directory",
    _consolidate_to(lambda sb: _mkdir(sb.root / "m.pt"), "--force"),
    "m.pt",
    "a directory",
)
case(
    "ckpt-consolidate/out-parent-missing",
    _consolidate_to(lambda sb: sb.root / "no" / "m.pt"),
    "m.pt",
    "not a writable directory",
)
case(
    "ckpt-consolidate/out-under-a-file",
    _consolidate_to(lambda sb: sb.write("f", "x") / "m.pt"),
    "m.pt",
)

_NOT_CHECKPOINTS: dict[str, tuple[Callable[[Sandbox], Path], tuple[str, ...]]] = {
    "missing": (lambda sb: sb.root / "nope", ("nope", "no such checkpoint directory")),
    "a-file": (lambda sb: sb.write("afile", "x"), ("afile", "no such checkpoint directory")),
    "empty": (lambda sb: _mkdir(sb.root / "empty"), ("empty", "no checkpoint")),
    "only-tmp": (
        lambda sb: _mkdir(_mkdir(sb.root / "ck") / ".tmp-step-00000002-abcd").parent,
        ("ck", "no checkpoint"),
    ),
}
for _name, (_dir, _expect) in _NOT_CHECKPOINTS.items():
    for _action in ("inspect", "verify"):
        case(
            f"ckpt-{_action}/dir-{_name}",
            command("ckpt", _action, _dir),
            *_expect,
        )
    case(
        f"ckpt-consolidate/dir-{_name}",
        command("ckpt", "consolidate", _dir, _out),
        *_expect,
    )


# ----------------------------------------------------------------------------------------------
# a full disk, and bad input found inside the ranks


def _full_disk(nproc: int) -> Callable[[Sandbox], Proc]:
    """A tmpfs big enough for one checkpoint of the tiny job (step 2), not for two (step 4)."""

    def build(sb: Sandbox) -> Proc:
        disk = sb.enter(mount_tmpfs(sb.root / "disk", "600k"))
        sb.allow_tree(disk)
        sb.expect(disk)
        config = sb.job("plain", {"run.output_dir": str(disk / "out")})
        return Proc(argv("train", config, "--nproc", str(nproc)), timeout=120)

    return build


def _first_checkpoint_intact(sb: Sandbox) -> None:
    from gpu_training.checkpoint import verify_checkpoints

    root = sb.root / "disk" / "out" / "checkpoints"
    assert verify_checkpoints(root) == {root / STEPS[0]: []}, "the checkpoint before the full disk"


case(
    "train/disk-full",
    _full_disk(1),
    "No space left on device",
    row="disk-full",
    after=_first_checkpoint_intact,
)
case(
    "train/disk-full-2-ranks",
    _full_disk(2),
    "No space left on device",
    row="disk-full",
    after=_first_checkpoint_intact,
)

_USER_TASK = """\
import torch
from torch.utils.data import TensorDataset


def model():
    return torch.nn.Linear(4, 3)


def data():
    return TensorDataset(torch.randn(6, 4), torch.randint(0, 3, (6,))), None
"""


def _user_task_too_small(sb: Sandbox) -> Proc:
    """A user task whose data holds no global batch: only the ranks find out (they import and
    build it; the launching host checks the built-in task's data only)."""
    sb.write("tinytask.py", _USER_TASK)
    job = sb.job("plain", {"task": {"model": "tinytask:model", "data": "tinytask:data"}})
    return Proc(argv("train", job, "--nproc", "2"), timeout=120)


case("train-ranks/user-data-too-small", _user_task_too_small, "global batch", "16")


# ----------------------------------------------------------------------------------------------
# resuming with changed settings (a changed run.log_every only warns: test_bad_input.py)


for _fmt in FORMATS:
    case(
        f"train/{_fmt}/changed-learning-rate",
        then(_checkpoint(_fmt), train(_fmt, "--set", "training.learning_rate=0.002")),
        "training.learning_rate: 0.001 -> 0.002",
        "--allow-config-change",
        row="changed-lr-silent",
    )
for _fmt in ("plain", "dcp"):  # DeepSpeed's engine checks the shapes itself, in the ranks
    case(
        f"train/{_fmt}/other-model-shape",
        then(
            _checkpoint(_fmt),
            train(_fmt, "--set", "task_options.n_embd=64", "--allow-config-change"),
        ),
        "another shape",
        NEWEST,
        row="resume-other-shape",
    )
case(
    "train/plain/other-model-shape-no-allow",
    then(_checkpoint("plain"), train("plain", "--set", "task_options.n_embd=64")),
    "task_options.n_embd: 32 -> 64",
    "--allow-config-change",
    row="resume-other-shape",
)
# every format resumes every other (tests/test_resume_anywhere.py): a model of another shape
# is named before launch where the saved format says its shapes (plain, DCP), else by the ranks
for _fmt, _other in (
    ("plain", "dcp"),
    ("dcp", "plain"),
    ("plain", "deepspeed"),
    ("deepspeed", "plain"),
):
    case(
        f"train/{_fmt}/other-model-shape-under-{_other}",
        then(
            _checkpoint(_fmt),
            train(_other, "--set", "task_options.n_embd=64", "--allow-config-change"),
        ),
        "another shape",
        NEWEST,
        row="resume-other-shape",
    )
case(
    "train/dcp/other-global-batch",
    then(_checkpoint("dcp"), train("dcp", "--set", "training.global_batch_size=32")),
    "training.global_batch_size: 16 -> 32",
)


# ----------------------------------------------------------------------------------------------
# issue 31: the shapes and the layout of a resume under every strategy (none, DDP, FSDP2,
# ZeRO) and from every format: one line before launch, nothing written


_STRATEGIES = {  # job strategy -> (the format its job writes, its --nproc)
    "none": ("plain", "1"),
    "ddp": ("plain", "2"),
    "fsdp": ("dcp", "2"),
    "deepspeed": ("deepspeed", "2"),
}


def _resume(strategy: str, nproc: str, *extra: str) -> Callable[[Sandbox], list[str]]:
    """``train`` of the ``strategy`` job on ``nproc`` ranks, resuming the sandbox's checkpoint."""
    fmt = _STRATEGIES[strategy][0]
    changes = {"strategy.name": strategy} if strategy == "none" else None
    return lambda sb: argv("train", sb.job(fmt, changes), "--nproc", nproc, *extra)


_WIDER = ("--set", "task_options.n_embd=64", "--allow-config-change")
_DONE = {("plain", "ddp"), ("dcp", "fsdp"), ("plain", "fsdp"), ("dcp", "ddp")}
_DONE |= {("plain", "deepspeed"), ("deepspeed", "ddp")}  # the cases above
for _fmt in FORMATS:
    for _strategy, (_own, _nproc) in _STRATEGIES.items():
        if (_fmt, _strategy) not in _DONE:
            case(
                f"train/{_fmt}/other-model-shape-under-{_strategy}",
                then(_checkpoint(_fmt), _resume(_strategy, _nproc, *_WIDER)),
                "another shape",
                "is [",  # the saved shape, then the job's
                NEWEST,
                row="resume-other-shape",
            )
for _strategy, (_own, _) in _STRATEGIES.items():
    case(
        f"train/{_own}/global-batch-16-on-3-ranks-under-{_strategy}",
        then(_checkpoint(_own), _resume(_strategy, "3")),
        "--nproc 3",
        "global batch 16",
        row="global-batch-nproc-2",
    )
