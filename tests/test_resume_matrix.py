"""Every layout resumes every other: none, DDP, FSDP2, ZeRO-1/2/3 at 1, 2 and 4 ranks.

The full matrix of issue 31 (``make test-matrix``; ``make test`` runs the subset in
tests/test_resume_anywhere.py): each layout's uninterrupted 20 steps, and for every pair a
copy of the source stopped after step 10, resumed by ``train`` at the target and compared
with the target's uninterrupted run — bitwise on the same layout, within 1e-5 on another.
ZeRO-2 and ZeRO-3 with their optimizer state offloaded to the CPU (2 ranks) are layouts too.
One same-layout cell is not bitwise for a reason older than resharding: DDP on 4 ranks
(``_NOT_BITWISE``, a strict xfail: it fails once fixed, to be taken off the list).
Marked ``matrix``: deselected unless ``-m`` names it (tests/conftest.py). Each cell's
figure (max |weights - uninterrupted|) is printed and, with ``GT_RESUME_MATRIX=FILE``,
written there as JSON lines.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from resume_jobs import TOL, diff, has_deepspeed, job_file, layout, stopped_copy, weights
from train_jobs import train

pytestmark = [
    pytest.mark.matrix,
    pytest.mark.multirank,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

LAYOUTS = (
    "none1",
    *(f"{kind}{n}" for kind in ("ddp", "fsdp") for n in (1, 2, 4)),
    *(f"zero{stage}x{n}" for stage in (1, 2, 3) for n in (1, 2, 4)),
    "zero2offx2",
    "zero3offx2",
)


_NOT_BITWISE = {
    ("ddp4", "ddp4"): "DDP on 4 gloo ranks resumes 1.5e-8 from itself, as it did before issue 31"
}
"""Same-layout cells measured not bitwise, for a reason outside resharding (to be fixed)."""


def _cell(source: str, target: str) -> object:
    needs = not (has_deepspeed(source) and has_deepspeed(target))
    marks = [pytest.mark.skipif(needs, reason="needs the deepspeed extra")]
    if (source, target) in _NOT_BITWISE:
        marks.append(pytest.mark.xfail(reason=_NOT_BITWISE[source, target], strict=True))
    return pytest.param(source, target, marks=marks, id=f"{source}-{target}")


class _Runs:
    """Each layout's uninterrupted run, trained the first time a cell asks for it (so that
    ``-k`` picking a few cells trains only their layouts)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[str, Path] = {}

    def __getitem__(self, name: str) -> Path:
        if name not in self.done:
            strategy, nproc = layout(name)
            train(job_file(self.root / name, strategy), nproc)
            self.done[name] = self.root / name
        return self.done[name]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> _Runs:
    return _Runs(tmp_path_factory.mktemp("uninterrupted"))


@pytest.mark.parametrize(("source", "target"), [_cell(s, t) for s in LAYOUTS for t in LAYOUTS])
def test_every_layout_resumes_every_other(
    uninterrupted: _Runs, tmp_path: Path, source: str, target: str
) -> None:
    out = stopped_copy(uninterrupted[source], tmp_path / "resumed")
    strategy, nproc = layout(target)
    train(job_file(out, strategy), nproc)
    gap = diff(weights(uninterrupted[target]), weights(out))
    print(f"{source} -> {target}: {gap:.1e}")
    report = os.environ.get("GT_RESUME_MATRIX")
    if report:
        with open(report, "a", encoding="utf-8") as f:
            f.write(json.dumps({"from": source, "to": target, "max_abs_diff": gap}) + "\n")
    if source == target:
        assert gap == 0.0, f"{source} resumed on its own layout is not bitwise: {gap:.2e}"
    else:
        assert gap <= TOL, f"{source} -> {target} after step 10: {gap:.2e}"
