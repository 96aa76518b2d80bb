"""The bad-input table of ``test_bad_input.py``: :class:`Case`, its registry, Context rows.

A case builds its inputs in a :class:`~bad_input_kit.Sandbox` and returns what to run: an
argv for ``gpu_training.cli.main`` (in this process), a :class:`Proc` argv (a fresh
process: torchrun, a full disk), or a Python callable (the ``CheckpointManager`` API). The
test then holds it to the contract: the exit code, one ``gpu-training: error:`` line on
stderr naming the field, flag or file (the case's fragments), no traceback, nothing written
outside the case's intended outputs, nothing lost, and no pickle payload run.

The cases themselves are in ``bad_input_cli_cases.py`` (fields, flags, files) and
``bad_input_ckpt_cases.py`` (checkpoints, payloads, links, unwritable places, resume);
importing them fills :data:`CASES`. :data:`ROWS` are the rows of issue 13's Context: a case
covering one carries its slug first in its id, and the test checks that every row has one.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bad_input_kit import Sandbox

__all__ = [
    "CASES",
    "ROWS",
    "Action",
    "Case",
    "Proc",
    "argv",
    "case",
    "command",
    "fragments",
    "table",
    "template",
    "then",
]

ROWS: dict[str, str] = {
    "ds-manifest-runs-payload": "ckpt consolidate on a manifest saying deepspeed ran a pickle "
    "payload in *_optim_states.pt",
    "symlinked-state-copied": "a state.pt symlinked outside the checkpoint is followed and copied",
    "job-file-is-code": "job files are code by design, but no doc says so",
    "all-truncated-restart-at-0": "every state.pt truncated: train starts again at step 0 and "
    "overwrites them",
    "consolidate-into-own-step": "ckpt consolidate CK CK/step-N/state.pt --force destroys the "
    "checkpoint",
    "metrics-twice-after-resume": "metrics.jsonl holds the steps between the last checkpoint "
    "and a crash twice",
    "global-batch-nproc-2": "a global batch that splits at 1 rank but not at --nproc 2: a "
    "traceback after torchrun started",
    "task-option-out-of-range": "a task option out of range (block_size larger than the corpus)",
    "resume-other-shape": "resuming into a checkpoint of another model shape: 47 lines",
    "malicious-or-corrupt-resume": "a malicious or fully corrupt checkpoint on train resume",
    "ckpt-dir-read-only-or-under-file": "a checkpoint directory read-only or under a file, "
    "noticed at the first save",
    "plan-1e400": "plan --gpu-memory 1e400GB: OverflowError",
    "disk-full": "disk full prints ~200 lines for one cause",
    "empty-job-file": "an empty job file trains the default job",
    "config-check-shipped-jobs": "config check rejects every shipped job file",
    "plan-charlm": "plan charlm prints a command that fails, and a margin where the share fits",
    "find-batch-global": "find-batch recommends 870 per device for a job of global batch 32",
    "changed-lr-silent": "a changed learning rate resumes silently",
    "monitor-no-gpu": "monitor --once with no GPU exits 0",
}
"""Issue 13's Context rows, by slug."""


@dataclass(frozen=True)
class Proc:
    """Run ``python -m gpu_training ARGV`` in a fresh process (torchrun, a small disk...)."""

    argv: Sequence[str]
    timeout: float = 120.0


Action = Sequence[str] | Proc | Callable[[], object]
"""What a case runs: CLI arguments (in process), a :class:`Proc`, or a Python callable."""


@dataclass(frozen=True)
class Case:
    """One bad input and what the contract expects of it."""

    id: str
    """``<row slug>:<what>`` when it covers a Context row, else ``<what>``."""
    make: Callable[[Sandbox], Action]
    """Builds the inputs in the sandbox and returns what to run."""
    code: int = 2
    """The exit code: 2 for bad input; 1 for ``ckpt verify`` finding damage and ``monitor``
    without a GPU; 0 where the input is harmless to this command (``ckpt inspect`` of a
    checkpoint whose pickles it never opens). For a callable, 2: it raised
    ``CheckpointError`` or ``ConfigError``; 0: it returned."""
    expect: tuple[str, ...] = ()
    """Fragments the error line (or stdout, see ``stream``) must hold."""
    reject: tuple[str, ...] = ()
    """Fragments it must not hold (e.g. a ``--trust-checkpoint`` hint where it cannot help)."""
    stream: str = "stderr"
    """``"stderr"``: exactly one line there, holding the fragments; ``"stdout"``: stderr is
    empty and stdout holds them (a report: ``ckpt verify``, ``ckpt inspect``)."""
    prefix: str = "gpu-training: error: "
    """How the one stderr line starts."""
    xfail: str | None = None
    """Why the product is still wrong here: the case stays in, expected to fail."""
    strict: bool = True
    """Whether an unexpected pass fails (False where another session is fixing it now)."""
    after: Callable[[Sandbox], None] | None = None
    """A last check of the case's own (e.g. the checkpoint written before a full disk)."""
    needs: str | None = None
    """A package the case needs (skipped without it), e.g. ``deepspeed``."""


CASES: list[Case] = []


def case(
    id: str,
    make: Callable[[Sandbox], Action],
    *expect: str,
    row: str | None = None,
    **options: Any,
) -> None:
    """Adds a :class:`Case` to :data:`CASES` (``row``: the Context row it covers)."""
    assert row is None or row in ROWS, row
    if "deepspeed" in id.split("/"):  # a DeepSpeed checkpoint or strategy
        options.setdefault("needs", "deepspeed")
    CASES.append(Case(f"{row}:{id}" if row else id, make, expect=expect, **options))


def argv(*args: str | Path) -> list[str]:
    """Command-line arguments as strings."""
    return [str(a) for a in args]


Part = str | Path | Callable[[Sandbox], object]
"""A command-line argument, or what makes one from the sandbox (a file it writes...)."""


def command(*parts: Part) -> Callable[[Sandbox], list[str]]:
    """A case's ``make`` that runs these arguments; callable parts are called with the sandbox."""

    def build(sb: Sandbox) -> list[str]:
        return [str(part(sb)) if callable(part) else str(part) for part in parts]

    return build


def then(
    setup: Callable[[Sandbox], object], run: Callable[[Sandbox], Action]
) -> Callable[[Sandbox], Action]:
    """A case's ``make``: ``setup`` builds the inputs, then ``run`` says what to run."""

    def make(sb: Sandbox) -> Action:
        setup(sb)
        return run(sb)

    return make


def table(text: str) -> list[list[str]]:
    """The rows of a ``" | "``-separated text table (blank and ``#`` lines skipped)."""
    return [
        [cell.strip() for cell in line.split(" | ")]
        for line in text.strip().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def fragments(cell: str) -> tuple[str, ...]:
    """A table cell of ``"; "``-separated fragments."""
    return tuple(f.strip() for f in cell.split("; ") if f.strip())


def template(
    text: str, places: dict[str, Callable[[Sandbox], object]]
) -> Callable[[Sandbox], list[str]]:
    """Command-line arguments from ``text`` (shell words); ``{name}`` is ``places[name](sb)``."""

    def build(sb: Sandbox) -> list[str]:
        values = {k: str(make(sb)) for k, make in places.items() if "{" + k + "}" in text}
        return [word.format(**values) for word in shlex.split(text)]

    return build
