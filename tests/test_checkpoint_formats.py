"""Checkpoint formats are objects: the registry, each format through its interface, no switches.

``gpu_training.checkpoint.formats`` holds one :class:`CheckpointFormat` per format and the one
place their names are resolved. Here: every name resolves, an unknown one is a one-line error;
each format saves, loads and reads offline through the interface alone (plain and DCP in this
process, DeepSpeed on one gloo rank); plain and sharded load each other's checkpoints through
the same interface (tests/test_resume_anywhere.py runs it across world sizes); and nothing
outside the formats module compares a format name, so that a new switch fails here rather than
becoming the seventh.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from dist_harness import REPO_ROOT, run_ranks
from gpu_training.checkpoint import CheckpointError, CheckpointManager, consolidate, read_manifest
from gpu_training.checkpoint.formats import (
    DEEPSPEED,
    NAMES,
    PLAIN,
    SHARDED,
    CheckpointFormat,
    checkpoint_format,
    format_of,
)
from gpu_training.ddp import DistributedContext
from gpu_training.resume import capture_run_state
from gpu_training.streaming import StreamPosition

SRC = Path(__file__).resolve().parents[1] / "src" / "gpu_training"
FORMATS_MODULE = SRC / "checkpoint" / "formats.py"
FORMATS: tuple[CheckpointFormat, ...] = (PLAIN, SHARDED, DEEPSPEED)


# ----------------------------------------------------------------------------------------------
# the registry


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("torch", PLAIN),
        ("plain", PLAIN),
        ("dcp", SHARDED),
        ("sharded", SHARDED),
        ("fsdp", SHARDED),
        ("deepspeed", DEEPSPEED),
        ("zero", DEEPSPEED),
    ],
)
def test_every_name_of_a_format_resolves_to_it(name: str, expected: CheckpointFormat) -> None:
    assert checkpoint_format(name) is expected
    assert NAMES[name] is expected


def test_the_registry_holds_the_three_formats_under_their_manifest_names() -> None:
    assert set(map(id, NAMES.values())) == set(map(id, FORMATS))
    assert [f.name for f in FORMATS] == ["torch", "dcp", "deepspeed"]
    for fmt in FORMATS:
        assert checkpoint_format(fmt.name) is fmt
        assert format_of({"state_format": fmt.name}) is fmt
    assert format_of({}) is PLAIN  # plain manifests name no format


def test_an_unknown_format_name_is_a_one_line_error_naming_it() -> None:
    with pytest.raises(CheckpointError) as info:
        checkpoint_format("pickle")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("unknown checkpoint format 'pickle': expected one of ")
    assert all(name in message for name in NAMES)


def test_a_manifest_naming_an_unknown_format_is_read_as_plain_but_resumed_by_none() -> None:
    found = format_of({"state_format": "pickle"})
    assert found.title == found.label == found.name == "pickle"
    assert found.loader == PLAIN.loader and not found.lists_every_file
    assert not any(fmt.can_load(found) for fmt in FORMATS)


def test_every_format_loads_every_other() -> None:
    assert all(fmt.can_load(other) for fmt in FORMATS for other in FORMATS)
    assert [f.shards for f in FORMATS] == [False, True, True]


def test_what_messages_call_each_format() -> None:
    assert [(f.title, f.label, f.loader) for f in FORMATS] == [
        ("plain", "torch", "CheckpointManager.load()"),
        (
            "sharded (FSDP/DCP)",
            "dcp (sharded, torch.distributed.checkpoint)",
            "CheckpointManager.load_sharded()",
        ),
        ("DeepSpeed", "deepspeed", "CheckpointManager.load_deepspeed()"),
    ]


# ----------------------------------------------------------------------------------------------
# each format through the interface


@dataclass
class _Run:
    """A :class:`~gpu_training.checkpoint.formats.Checkpointable` without a strategy."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    engine: Any = None


def _trained(seed: int) -> _Run:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(2):
        nn.functional.mse_loss(model(torch.randn(3, 4)), torch.randn(3, 2)).backward()
        optimizer.step()
        optimizer.zero_grad()
    return _Run(model, optimizer)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("fmt", [PLAIN, SHARDED], ids=["plain", "dcp"])
def test_a_format_round_trips_a_run_through_its_interface(
    fmt: CheckpointFormat, tmp_path: Path
) -> None:
    ctx = DistributedContext()
    ckpt = CheckpointManager(tmp_path / "ck", ctx=ctx)
    saved = _trained(0)
    run_state = capture_run_state(ctx, step=3, sampler=StreamPosition(8))
    path = fmt.save(ckpt, saved, run_state, {"note": "kept"})
    assert path is not None and path.name == "step-00000003"
    manifest = json.loads((path / "manifest.json").read_text())
    assert format_of(manifest) is fmt

    loaded = _trained(1)  # other weights, other optimizer moments
    state, extra = fmt.load(ckpt, loaded, path)
    assert _same(loaded.model.state_dict(), saved.model.state_dict())
    moments = [s["exp_avg"] for s in saved.optimizer.state_dict()["state"].values()]
    again = [s["exp_avg"] for s in loaded.optimizer.state_dict()["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(moments, again, strict=True))
    assert state["step"] == 3 and state["world_size"] == 1
    assert extra["note"] == "kept"

    # offline, in this process: what preflight, consolidation and export read
    fmt.check_contents(path, manifest)
    shapes = {k: tuple(v.shape) for k, v in saved.model.state_dict().items()}
    assert fmt.saved_shapes(path, manifest) == shapes
    full = fmt.full_state(path, manifest)
    assert _same(full["model_state"], saved.model.state_dict())
    assert "optimizer_state" in full
    assert fmt.read_extra(path)["note"] == "kept"
    run = fmt.read_run_state(path)  # what preflight reads of the data position
    assert run["sampler_state"] == StreamPosition(8).state_dict() and run["world_size"] == 1
    assert "model_state" not in run and "optimizer_state" not in run


@pytest.mark.parametrize("fmt", [PLAIN, SHARDED], ids=["plain", "dcp"])
def test_a_format_read_per_parameter_fills_another_model_exactly(
    fmt: CheckpointFormat, tmp_path: Path
) -> None:
    """``param_source`` and the torch sink: what resharding into another layout reads."""
    from gpu_training.checkpoint.full_state import load_into_module, module_order

    ctx = DistributedContext()
    ckpt = CheckpointManager(tmp_path / "ck", ctx=ctx)
    saved = _trained(0)
    path = fmt.save(ckpt, saved, capture_run_state(ctx, step=3), {"note": "kept"})
    assert path is not None
    manifest = json.loads((path / "manifest.json").read_text())
    loaded = _trained(1)
    source = fmt.param_source(path, manifest, order=module_order(loaded.model, loaded.optimizer))
    assert source.names == ["0.weight", "0.bias", "2.weight", "2.bias"]
    first = source.read(["0.weight"])["0.weight"]
    assert torch.equal(first.weight, saved.model[0].weight)
    assert sorted(first.state) == ["exp_avg", "exp_avg_sq", "step"]
    assert source.run_state()[1]["note"] == "kept"

    load_into_module(loaded.model, loaded.optimizer, source)
    assert _same(loaded.model.state_dict(), saved.model.state_dict())
    before, after = saved.optimizer.state_dict()["state"], loaded.optimizer.state_dict()["state"]
    assert before.keys() == after.keys()
    assert all(torch.equal(before[i][k], after[i][k]) for i in before for k in before[i])

    wider = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    with pytest.raises(CheckpointError, match=r"another shape: '0.weight' is \[8, 4\] there"):
        load_into_module(wider, torch.optim.AdamW(wider.parameters()), source)


def test_the_wrong_format_for_a_checkpoint_is_named_with_its_loader(tmp_path: Path) -> None:
    ctx = DistributedContext()
    ckpt = CheckpointManager(tmp_path, ctx=ctx)
    path = PLAIN.save(ckpt, _trained(0), capture_run_state(ctx, step=1))
    assert path is not None
    with pytest.raises(CheckpointError) as info:  # the manager's own loaders: one format each
        ckpt.load_sharded(_trained(1).model, None, path)
    assert str(info.value).endswith(
        f"{path} is a plain checkpoint, not sharded (FSDP/DCP): load it with "
        "CheckpointManager.load(), not CheckpointManager.load_sharded()"
    )
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, "state_format": "pickle"}))
    with pytest.raises(CheckpointError) as info:  # a format it cannot load: refused by name
        SHARDED.load(ckpt, _trained(1), path)
    assert str(info.value).endswith(
        f"{path} is a pickle checkpoint, not sharded (FSDP/DCP): load it with "
        "CheckpointManager.load(), not CheckpointManager.load_sharded()"
    )
    (path / "manifest.json").write_text(json.dumps({**manifest, "state_format": "deepspeed"}))
    with pytest.raises(CheckpointError, match=r"step-00000001 holds no DeepSpeed optimizer files$"):
        SHARDED.load(ckpt, _trained(1), path)  # read per parameter: its files must be there


def _moments(optimizer: torch.optim.Optimizer, names: list[str]) -> dict[str, torch.Tensor]:
    """Each parameter's AdamW state by name (``optimizer`` updates ``names`` in order)."""
    state = optimizer.state_dict()["state"]
    ids = [i for group in optimizer.state_dict()["param_groups"] for i in group["params"]]
    return {
        f"{name}.{key}": value
        for name, i in zip(names, ids, strict=True)
        if i in state
        for key, value in state[i].items()
    }


@pytest.mark.parametrize(
    ("written", "read"),
    [(PLAIN, SHARDED), (SHARDED, PLAIN)],
    ids=["plain-sharded", "sharded-plain"],
)
def test_a_format_loads_the_other_formats_checkpoint_with_its_optimizer_state(
    written: CheckpointFormat, read: CheckpointFormat, tmp_path: Path
) -> None:
    ctx = DistributedContext()
    ckpt = CheckpointManager(tmp_path, ctx=ctx)
    saved = _trained(0)
    path = written.save(ckpt, saved, capture_run_state(ctx, step=3), {"note": "kept"})
    loaded = _trained(1)
    state, extra = read.load(ckpt, loaded, path)
    assert _same(loaded.model.state_dict(), saved.model.state_dict())
    names = [n for n, _ in saved.model.named_parameters()]
    before, after = _moments(saved.optimizer, names), _moments(loaded.optimizer, names)
    assert len(before) == 3 * len(names)  # exp_avg, exp_avg_sq, step
    assert _same(after, before)
    assert (state["step"], state["world_size"], extra["note"]) == (3, 1, "kept")


def _grouped(seed: int) -> _Run:
    """Decay and no-decay groups, listed against the parameters' order, and a frozen weight."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    model[0].weight.requires_grad_(False)
    params = dict(model.named_parameters())
    groups = [
        {"params": [params["0.bias"], params["2.bias"]], "weight_decay": 0.0},
        {"params": [params["2.weight"]], "weight_decay": 0.1},
    ]
    optimizer = torch.optim.AdamW(groups, lr=0.01)
    for _ in range(2):
        nn.functional.mse_loss(model(torch.randn(3, 4)), torch.randn(3, 2)).backward()
        optimizer.step()
        optimizer.zero_grad()
    return _Run(model, optimizer)


def test_plain_optimizer_state_finds_its_parameters_by_group_and_position(tmp_path: Path) -> None:
    """A plain optimizer state is keyed by index: read into a sharded run, each index must reach
    the parameter at its place in the target's groups (the same order, built the same way)."""
    ctx = DistributedContext()
    ckpt = CheckpointManager(tmp_path, ctx=ctx)
    saved = _grouped(0)
    path = PLAIN.save(ckpt, saved, capture_run_state(ctx, step=2))
    loaded = _grouped(1)
    SHARDED.load(ckpt, loaded, path)
    names = ["0.bias", "2.bias", "2.weight"]
    assert _same(_moments(loaded.optimizer, names), _moments(saved.optimizer, names))
    groups = loaded.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.0, 0.1]

    other = _trained(2)  # one group of four parameters where the checkpoint has 2 + 1
    with pytest.raises(CheckpointError, match=r"param groups of \[2, 1\] parameters and this "):
        SHARDED.load(ckpt, other, path)


def test_a_plain_checkpoint_of_another_shape_is_refused_by_the_sharded_load(
    tmp_path: Path,
) -> None:
    ctx = DistributedContext()
    ckpt = CheckpointManager(tmp_path, ctx=ctx)
    path = PLAIN.save(ckpt, _trained(0), capture_run_state(ctx, step=1))
    wider = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    run = _Run(wider, torch.optim.AdamW(wider.parameters()))
    with pytest.raises(CheckpointError) as info:
        SHARDED.load(ckpt, run, path)
    message = str(info.value)
    assert "\n" not in message
    assert "another shape: '0.weight' is [8, 4] there and [16, 4] in this job" in message


DS_CONFIG = REPO_ROOT / "configs" / "deepspeed_config.json"


def _deepspeed_round_trip(root: str) -> dict[str, Any]:
    from gpu_training.config import TrainingConfig
    from gpu_training.ddp import cleanup_distributed, init_distributed
    from gpu_training.strategy import prepare

    ctx = init_distributed()
    try:
        out: dict[str, Any] = {}
        cfg = TrainingConfig(per_device_batch_size=4, precision="fp32", learning_rate=0.05)
        strategy = {"name": "deepspeed", "zero_stage": 2, "deepspeed_config": str(DS_CONFIG)}
        torch.manual_seed(0)
        run = prepare(nn.Linear(4, 2), strategy, ctx, cfg, device="cpu")
        out["picked"] = run.checkpoint_format is DEEPSPEED
        x, y = torch.randn(4, 4), torch.randn(4, 2)
        run.steps.backward(nn.functional.mse_loss(run.model(x), y))
        run.steps.step(0)
        weights = {k: v.detach().clone() for k, v in run.model.module.state_dict().items()}
        ckpt = CheckpointManager(root, ctx=ctx)
        path = DEEPSPEED.save(ckpt, run, capture_run_state(ctx, step=1), {"note": "kept"})
        run.steps.backward(nn.functional.mse_loss(run.model(x), y))
        run.steps.step(0)  # the weights move on; the load puts them back
        state, extra = DEEPSPEED.load(ckpt, run, str(path))
        after = run.model.module.state_dict()
        out["restored"] = all(torch.equal(after[k], v) for k, v in weights.items())
        out["step"], out["note"] = state["step"], extra["note"]
        manifest = json.loads((Path(str(path)) / "manifest.json").read_text())
        out["format_of"] = format_of(manifest) is DEEPSPEED
        DEEPSPEED.check_contents(Path(str(path)), manifest)
        out["shapes"] = DEEPSPEED.saved_shapes(Path(str(path)), manifest)
        full = DEEPSPEED.full_state(Path(str(path)), manifest)
        out["full"] = all(torch.equal(full["model_state"][k], v) for k, v in weights.items())
        out["extra"] = DEEPSPEED.read_extra(Path(str(path)))["note"]
        out["run_state"] = DEEPSPEED.read_run_state(Path(str(path)))["step"]
        del run
        return out
    finally:
        cleanup_distributed()


@pytest.mark.multirank
@pytest.mark.timeout(180)
@pytest.mark.skipif(find_spec("deepspeed") is None, reason="needs the deepspeed extra")
def test_deepspeed_round_trips_a_run_through_its_interface(tmp_path: Path) -> None:
    (r,) = run_ranks(_deepspeed_round_trip, 1, args=(str(tmp_path),), timeout=150)
    assert r == {
        "picked": True,
        "restored": True,
        "step": 1,
        "note": "kept",
        "format_of": True,
        "shapes": {"weight": (2, 4), "bias": (2,)},  # param_shapes of its model-states file
        "full": True,
        "extra": "kept",
        "run_state": 1,
    }
    _, manifest = read_manifest(tmp_path)
    assert manifest["state_format"] == "deepspeed"


def test_consolidate_reads_every_format_through_it(tmp_path: Path) -> None:
    ctx = DistributedContext()
    saved = _trained(0)
    for fmt in (PLAIN, SHARDED):
        ckpt = CheckpointManager(tmp_path / fmt.name, ctx=ctx)
        fmt.save(ckpt, saved, capture_run_state(ctx, step=2))
        out = consolidate(tmp_path / fmt.name, tmp_path / f"{fmt.name}.pt")
        assert _same(torch.load(out, weights_only=True), saved.model.state_dict())


# ----------------------------------------------------------------------------------------------
# no switch on a format name outside the formats module

_FORMAT_WORDS = frozenset(NAMES)
"""Every name a format goes by (some are strategy names too: ``fsdp``, ``deepspeed``)."""
_ONLY_FORMAT_WORDS = frozenset({"dcp", "sharded"})
"""Names that are nothing but a format's: comparing with them is a format switch."""
_FORMAT_IDENTIFIERS = frozenset(
    {"SHARDED_FORMAT", "DEEPSPEED_FORMAT", "state_format", "checkpoint_format"}
)
"""What holds a format's name: the constants, the manifest's key, the strategy's property."""


def _identifiers(node: ast.AST) -> set[str]:
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.add(sub.attr)
        elif isinstance(sub, ast.Constant) and sub.value == "state_format":
            names.add(sub.value)
    return names


def _words(node: ast.AST) -> set[str]:
    return {
        sub.value
        for sub in ast.walk(node)
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
    }


def _compares_a_format_name(node: ast.Compare) -> bool:
    """A name held by a format identifier, or one only a format has, or a format's name held
    by anything called ``*format*`` / ``fmt`` — compared by value (``is`` compares objects)."""
    if all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
        return False
    operands = [node.left, *node.comparators]
    names = [_identifiers(op) for op in operands]
    words = set().union(*map(_words, operands))
    loosely = any(n == "fmt" or "format" in n.lower() for ns in names for n in ns)
    return bool(
        words & _ONLY_FORMAT_WORDS
        or set().union(*names) & _FORMAT_IDENTIFIERS
        or (words & _FORMAT_WORDS and loosely)
    )


def _matches_a_format_name(node: ast.Match) -> bool:
    words = set().union(*(_words(case.pattern) for case in node.cases))
    subject = _identifiers(node.subject)
    loosely = any(n == "fmt" or "format" in n.lower() for n in subject)
    return bool(words & _ONLY_FORMAT_WORDS or (words & _FORMAT_WORDS and loosely))


def _format_key(node: ast.AST | None) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("SHARDED_FORMAT", "DEEPSPEED_FORMAT")
    return isinstance(node, ast.Constant) and node.value in _ONLY_FORMAT_WORDS


def _reads_state_format(node: ast.AST) -> bool:
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "state_format"
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    first = node.args[0] if node.args else None
    return name == "state_format" or (
        name == "get" and isinstance(first, ast.Constant) and first.value == "state_format"
    )


def format_switches(source: str) -> list[str]:
    """Where ``source`` reads or compares a format's name itself: ``"<line>: <what>"``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Compare) and _compares_a_format_name(node):
            found.append(f"{line}: compares a format's name")
        elif _reads_state_format(node):
            found.append(f"{line}: reads the manifest's state_format")
        elif isinstance(node, ast.Dict) and any(_format_key(k) for k in node.keys):
            found.append(f"{line}: a table keyed by format names")
        elif isinstance(node, ast.Match) and _matches_a_format_name(node):
            found.append(f"{line}: matches a format's name")
    return found


@pytest.mark.parametrize(
    "switch",
    [
        'if self.checkpoint_format == "torch":\n    pass',
        'fmt = str(manifest.get("state_format", "torch"))',
        "if state_format(manifest) == SHARDED_FORMAT:\n    pass",
        'names = {SHARDED_FORMAT: "sharded (DCP)", DEEPSPEED_FORMAT: "DeepSpeed"}',
        'names = {"dcp": "sharded (FSDP/DCP)", "deepspeed": "DeepSpeed", "torch": "plain"}',
        'label = "dcp (sharded)" if kind == "dcp" else kind',
        'if manifest["state_format"] in MULTI_FILE:\n    pass',
        'if fmt == "deepspeed":\n    pass',
        'match fmt:\n    case "dcp":\n        pass',
        'match fmt:\n    case "deepspeed":\n        pass',
    ],
)
def test_the_detector_sees_each_switch_the_formats_replaced(switch: str) -> None:
    assert format_switches(switch), switch


@pytest.mark.parametrize(
    "fine",
    [
        'if spec.name == "deepspeed":\n    pass',  # a strategy's name, not a format's
        'if "torch" in name:\n    pass',
        'manifest["state_format"] = fmt.name',  # writing it
        "fmt = checkpoint_format(spec.checkpoint_format)",  # the lookup
        "if format_of(manifest) is fmt:\n    pass",  # objects, not names
        'if manifest.get("format") != FORMAT_NAME:\n    pass',  # the layout's, not a format's
        'match spec.name:\n    case "deepspeed":\n        pass',
    ],
)
def test_the_detector_lets_lookups_and_strategy_names_be(fine: str) -> None:
    assert not format_switches(fine), fine


def test_nothing_outside_the_formats_module_switches_on_a_format_name() -> None:
    found = {
        f"{path.relative_to(SRC.parent)}:{where}"
        for path in sorted(SRC.rglob("*.py"))
        if path != FORMATS_MODULE
        for where in format_switches(path.read_text(encoding="utf-8"))
    }
    assert not found, (
        "ask the format object (gpu_training.checkpoint.formats) instead of comparing names: "
        f"{sorted(found)}"
    )
