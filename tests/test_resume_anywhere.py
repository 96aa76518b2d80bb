"""Resume anywhere: none / DDP (plain), FSDP2 (sharded) and DeepSpeed ZeRO-1/2/3, any world size.

A run stopped after step 10 of 20 at one layout and resumed by ``gpu-training train`` at
another (strategy and rank count) ends where 20 uninterrupted steps at the new layout end,
within 1e-5: the bias-free charlm job of tests/test_invariance.py, dropout on, fp32. Every
source and every target layout appears at least once, and the world size changes up, down
and not at all:

- DDP x 2 -> FSDP x 4 and a plain model x 1 -> FSDP x 2 (a plain ``state.pt`` broadcast
  from rank 0 into the shards, the optimizer state renamed by parameter);
- FSDP x 4 -> a plain model x 1 and FSDP x 2 -> DDP x 2 (DCP resharding into whole tensors);
- ZeRO-2 x 2 -> ZeRO-2 x 4 (the resize DeepSpeed cannot do online), ZeRO-3 with its optimizer
  offloaded x 2 -> FSDP x 2, ZeRO-1 x 2 -> a plain model x 1 (DeepSpeed's files read per
  parameter), DDP x 2 -> ZeRO-1 x 2 and FSDP x 4 -> ZeRO-3 offloaded x 2 (per-parameter full
  state written into the engine's partitions).

Three negative controls drop the optimizer state on resume (DDP x 2 -> FSDP x 4, DDP x 2 ->
ZeRO-1 x 2, ZeRO-3 offloaded x 2 -> FSDP x 2: one per way of resharding it) and must miss
the uninterrupted run. Through the real command line: the line
``train`` prints before any process starts. ``make test`` runs every resume, the ZeRO-1
negative control and the DDP line; the other two controls and the ZeRO line are marked
``matrix`` (``make test-matrix``). A checkpoint whose model does not fit the job
under the other format is bad input (one line, exit 2, nothing written):
tests/bad_input_place_cases.py, ``other-model-shape-under-*``. Every pair of layouts at world
sizes 1, 2 and 4 is tests/test_resume_matrix.py (``make test-matrix``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from dist_harness import REPO_ROOT, run_python, run_ranks
from resume_jobs import STEPS, TOL, diff, has_deepspeed, job_file, layout, stopped_copy, title
from resume_jobs import weights as weights_of
from train_jobs import train

pytestmark = [pytest.mark.multirank, pytest.mark.slow, pytest.mark.timeout(600)]

LAYOUTS = ("ddp2", "fsdp2", "fsdp4", "none1", "zero1x2", "zero2x2", "zero2x4", "zero3offx2")
"""The uninterrupted runs: each is a case's target, and a stopped copy of it a case's source."""
CASES = [
    ("ddp2", "fsdp4"),
    ("none1", "fsdp2"),
    ("fsdp4", "none1"),
    ("fsdp2", "ddp2"),
    ("zero2x2", "zero2x4"),
    ("zero3offx2", "fsdp2"),
    ("zero1x2", "none1"),
    ("ddp2", "zero1x2"),
    ("fsdp4", "zero3offx2"),
]
"""Every source and every target layout at least once; the world size up, down, the same."""


def _case(source: str, target: str, *marks: pytest.MarkDecorator) -> object:
    needs = not (has_deepspeed(source) and has_deepspeed(target))
    skip = pytest.mark.skipif(needs, reason="needs the deepspeed extra")
    return pytest.param(source, target, marks=[skip, *marks], id=f"{source}-{target}")


def _said(source: str, target: str) -> str:
    (_, before), (_, after) = layout(source), layout(target)
    ranks = f"{before} rank{'s' * (before != 1)}"
    return f"written by {title(source)} on {ranks} under {title(target)} on {after}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("uninterrupted")
    runs = {}
    for name in LAYOUTS:
        if has_deepspeed(name):
            strategy, nproc = layout(name)
            runs[name] = tmp / name
            train(job_file(runs[name], strategy), nproc)
    return runs


@pytest.mark.parametrize(("source", "target"), [_case(*case) for case in CASES])
def test_a_run_resumes_under_another_format_and_world_size(
    uninterrupted: dict[str, Path], tmp_path: Path, source: str, target: str
) -> None:
    out = stopped_copy(uninterrupted[source], tmp_path / "resumed")
    strategy, nproc = layout(target)
    printed = train(job_file(out, strategy), nproc)
    said = f"{_said(source, target)}: optimizer state resharded"
    assert f"(step 10 {said})" in printed, printed
    gap = diff(weights_of(uninterrupted[target]), weights_of(out))
    print(f"{source} -> {target}: max |weights - uninterrupted| = {gap:.1e}")
    assert gap <= TOL, f"{source} -> {target} after step 10: {gap:.2e}"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == list(range(1, STEPS + 1))


def _dropping_the_optimizer_state(argv: list[str]) -> None:
    """A rank of ``train`` whose resharding loads keep the fresh optimizer: a plain
    checkpoint into FSDP2 shards (``reshard``), anything into a ZeRO engine (``zero_sink``),
    and a ZeRO checkpoint read per parameter (``zero_source``: its moments and steps left
    out)."""
    import gpu_training.checkpoint.reshard as reshard
    import gpu_training.checkpoint.zero_sink as zero_sink
    import gpu_training.checkpoint.zero_source as zero_source
    from gpu_training.checkpoint.full_state import ParamState
    from gpu_training.cli import main

    read = zero_source.ZeroSource.read

    def weights_only(self: Any, names: Any) -> dict[str, ParamState]:
        return {n: ParamState(full.weight) for n, full in read(self, names).items()}

    reshard.set_optimizer_state_dict = lambda *args, **kwargs: None  # type: ignore[assignment]
    zero_sink._flat_state = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    zero_source.ZeroSource.read = weights_only  # type: ignore[method-assign]
    code = main(argv)
    if code != 0:
        raise SystemExit(code)


@pytest.mark.parametrize(
    ("source", "target"),
    [
        _case("ddp2", "fsdp4", pytest.mark.matrix),
        _case("ddp2", "zero1x2"),
        _case("zero3offx2", "fsdp2", pytest.mark.matrix),
    ],
)
def test_the_negative_control_drops_the_optimizer_state_and_misses(
    uninterrupted: dict[str, Path], tmp_path: Path, source: str, target: str
) -> None:
    out = stopped_copy(uninterrupted[source], tmp_path / "dropped")
    strategy, nproc = layout(target)
    argv = ["train", str(job_file(out, strategy))]
    run_ranks(_dropping_the_optimizer_state, nproc, args=(argv,), timeout=300)
    gap = diff(weights_of(uninterrupted[target]), weights_of(out))
    print(f"{source} -> {target} without its optimizer state: {gap:.1e}")
    assert gap > 100 * TOL, f"without its optimizer state the resume still matched: {gap:.2e}"


@pytest.mark.parametrize(
    ("source", "override", "said"),
    [
        pytest.param("ddp2", "strategy.name=fsdp", "DDP on 2 ranks under FSDP on 2", id="ddp"),
        pytest.param(
            "zero2x2",
            "strategy.zero_stage=3",
            "ZeRO-2 on 2 ranks under ZeRO-3 on 2",
            marks=[
                pytest.mark.skipif(not has_deepspeed("zero2x2"), reason="needs deepspeed"),
                pytest.mark.matrix,
            ],
            id="zero",
        ),
    ],
)
def test_train_says_how_it_resumes_before_any_process_starts(
    uninterrupted: dict[str, Path], tmp_path: Path, source: str, override: str, said: str
) -> None:
    out = tmp_path / "finished"
    shutil.copytree(uninterrupted[source], out)  # step 20: it loads, then has nothing to do
    job = job_file(out, layout(source)[0])
    argv = ["-m", "gpu_training", "train", str(job), "--nproc", "2", "--set", override]
    proc = run_python(argv, timeout=300, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    said = f"written by {said}: optimizer state resharded"
    assert lines[0] == f"resuming step 20 {said}", proc.stdout
    assert any(line.endswith(f"(step 20 {said})") for line in lines), proc.stdout
