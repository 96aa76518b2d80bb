"""The bad-input sweep (issue 13, item 5): every command, held to the error contract.

Each case of :data:`bad_input_table.CASES` builds a bad input in its own directory — a
wrong field, a bad flag, an unreadable file, a damaged or hostile checkpoint, a place that
cannot be written — runs the command, and asserts what the contract in ``cli.py`` promises:

- the exit code: 2 for bad input (1 where a command reports a finding: ``ckpt verify`` on a
  damaged checkpoint, ``monitor`` with no GPU);
- exactly one line on stderr, ``gpu-training: error: ...``, naming the field, flag or file
  and what is expected; no traceback anywhere;
- nothing written: the case's directory tree (names, sizes, content hashes) is the same
  afterwards, so checkpoints are byte-identical (nothing lost);
- no pickle payload ran: a payload touches a marker file, which must not exist.

Cases run in this process through ``gpu_training.cli.main`` (fast); only those that need
torchrun or a fresh process (a full disk) start one. The checkpoints are trained for real
once per module (plain, sharded DCP, DeepSpeed ZeRO-2) and copied into each case. Positive
cases (what must keep working) are separate tests at the end.
"""

from __future__ import annotations

import json
import pickle
import shutil
import traceback
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

import bad_input_ckpt_cases  # noqa: F401  (fills CASES)
import bad_input_cli_cases  # noqa: F401  (fills CASES)
import bad_input_place_cases  # noqa: F401  (fills CASES)
from bad_input_kit import (
    STEPS,
    Payload,
    Sandbox,
    diff,
    poison_distcp,
    poison_metadata,
    poison_pt,
    snapshot,
    train_sources,
)
from bad_input_table import CASES, ROWS, Case, Proc
from dist_harness import REPO_ROOT, run_python

pytestmark = [pytest.mark.timeout(240)]

_QUIET_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)
"""What Python does not print by default: any other warning is a line on the user's stderr."""
_NEVER_SAY = ("will likely succeed",)
"""torch's advice on a refused pickle (re-run with ``weights_only=False``): never printed to a
user who may hold a hostile file."""


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The source runs (format -> run directory), trained once for the module."""
    if find_spec("deepspeed") is not None:
        # Imported here, outside any case's capture: DeepSpeed binds a log handler to the
        # sys.stdout of the moment it is first imported.
        import deepspeed  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401  (~1 s, once, not in the first DCP case)

    return train_sources(tmp_path_factory.mktemp("sources"))


@pytest.fixture
def sandbox(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Sandbox]:
    """The case's directory, its working directory; the source runs trained on first use."""
    monkeypatch.chdir(tmp_path)
    box = Sandbox(tmp_path, lambda: request.getfixturevalue("sources"))
    with box.stack:
        yield box


@dataclass
class Outcome:
    code: int | str
    """The exit code, or ``"traceback"`` when an exception escaped (a bug)."""
    out: str
    err: str


def _run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    from gpu_training.cli import main

    trace = ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            code: int | str = main(args)
        except SystemExit as exc:  # a rank's bad-input exit: the in-process equivalent
            code = exc.code if isinstance(exc.code, int) else 1
        except KeyboardInterrupt:
            raise
        except BaseException:
            code, trace = "traceback", traceback.format_exc()
    out, err = capsys.readouterr()
    shown = [w for w in caught if not issubclass(w.category, _QUIET_WARNINGS)]
    err += "".join(
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno, "") for w in shown
    )
    return Outcome(code, out, err + trace)


def _run_api(call: Any, capsys: pytest.CaptureFixture[str]) -> Outcome:
    from gpu_training.checkpoint import CheckpointError
    from gpu_training.config import ConfigError

    code: int | str = 0
    message = trace = ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the Python API may warn: a caller can filter it
        try:
            call()
        except (CheckpointError, ConfigError) as exc:
            code, message = 2, str(exc)
            if "\n" in message:
                trace = f"\n(the message spans {message.count(chr(10)) + 1} lines)"
        except KeyboardInterrupt:
            raise
        except BaseException:
            code, trace = "traceback", traceback.format_exc()
    out, _ = capsys.readouterr()
    return Outcome(code, out, message + trace)


def _run_proc(proc: Proc, cwd: Path) -> Outcome:
    done = run_python(["-m", "gpu_training", *proc.argv], timeout=proc.timeout, cwd=cwd)
    return Outcome(done.returncode, done.stdout, done.stderr)


def _problems(case: Case, sb: Sandbox, outcome: Outcome, api: bool) -> list[str]:
    problems = []
    if outcome.code != case.code:
        problems.append(f"exit code {outcome.code!r}, expected {case.code}")
    if "Traceback (most recent call last)" in outcome.out + outcome.err:
        problems.append("a traceback")
    lines = [line for line in outcome.err.splitlines() if line.strip()]
    if case.stream == "stderr":
        if len(lines) != 1:
            problems.append(f"{len(lines)} lines on stderr, expected one")
        elif not api and not lines[0].startswith(case.prefix):
            problems.append(f"the stderr line does not start with {case.prefix!r}")
        where = lines[-1] if lines else ""
    else:
        if lines:
            problems.append(f"stderr is not empty ({len(lines)} lines)")
        where = outcome.out
    # the sandbox's fragments name what a refusal must name: nothing to name when it passes
    wanted = [*case.expect, *(sb.expected if case.code != 0 else [])]
    missing = [f for f in wanted if f not in where]
    if missing:
        problems.append(f"the {case.stream} does not name {missing}")
    never = () if api else _NEVER_SAY  # the API's: bad_input_ckpt_cases, refusal cases
    found = [f for f in (*case.reject, *never) if f in outcome.err]
    if found:
        problems.append(f"the {case.stream} says {found}")
    if sb.marker.exists():
        problems.append("THE PICKLE PAYLOAD RAN")
    return problems


def _params() -> list[Any]:
    params = []
    for case in CASES:
        marks: list[Any] = []
        if case.needs and find_spec(case.needs) is None:
            marks.append(pytest.mark.skip(reason=f"needs {case.needs}"))
        if case.xfail:
            marks.append(pytest.mark.xfail(strict=case.strict, reason=case.xfail))
        params.append(pytest.param(case, id=case.id, marks=marks))
    return params


@pytest.mark.parametrize("case", _params())
def test_bad_input(case: Case, sandbox: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    action = case.make(sandbox)
    capsys.readouterr()  # what building the inputs printed is not the command's
    before = snapshot(sandbox.root)
    if isinstance(action, Proc):
        outcome = _run_proc(action, sandbox.root)
    elif callable(action):
        outcome = _run_api(action, capsys)
    else:
        outcome = _run_cli(list(action), capsys)
    after = snapshot(sandbox.root)
    problems = _problems(case, sandbox, outcome, api=callable(action))
    written = {p: how for p, how in diff(before, after).items() if not sandbox.may_write(p)}
    if written:
        problems.append(f"wrote or lost {len(written)} path(s): {_head(written)}")
    if not problems and case.after is not None:
        case.after(sandbox)
    assert not problems, (
        f"{case.id}: " + "; ".join(problems) + f"\n--- stderr ---\n{outcome.err[-3000:]}"
        f"\n--- stdout ---\n{outcome.out[-2000:]}"
    )


def _head(items: Mapping[str, str], n: int = 6) -> str:
    shown = [f"{path} ({how})" for path, how in list(items.items())[:n]]
    return ", ".join(shown) + (f", ... {len(items) - n} more" if len(items) > n else "")


# ----------------------------------------------------------------------------------------------
# the sweep itself


def test_the_sweep_is_big_enough_and_covers_every_context_row() -> None:
    assert len(CASES) >= 80, len(CASES)
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    covered = {case.id.split(":", 1)[0] for case in CASES if ":" in case.id} | set(POSITIVE_ROWS)
    assert set(ROWS) <= covered, f"Context rows without a case: {sorted(set(ROWS) - covered)}"


def test_the_payloads_are_real(sandbox: Sandbox) -> None:
    """An unsafe loader would run each planted payload: the cases above can fail."""
    import io

    import torch

    from gpu_training.checkpoint.dcp_read import read_dcp_metadata

    shutil.copytree(sandbox.source_run("dcp") / "checkpoints" / STEPS[-1], sandbox.root / "s")
    step = sandbox.root / "s"
    poison_pt(step / "extra.pt", sandbox.marker)
    torch.load(step / "extra.pt", weights_only=False)
    assert sandbox.marker.exists(), "torch.load(weights_only=False) did not run the payload"
    sandbox.marker.unlink()

    fqn = poison_distcp(step, "__0_0.distcp", sandbox.marker)
    metadata = read_dcp_metadata(step / ".metadata")
    info = next(v for k, v in (metadata.storage_data or {}).items() if k.fqn == fqn)
    with open(step / info.relative_path, "rb") as f:
        f.seek(info.offset)
        blob = f.read(info.length)
    torch.load(io.BytesIO(blob), weights_only=False)  # what DCP's default planner does
    assert sandbox.marker.exists(), "DCP's unsafe value load did not run the payload"
    sandbox.marker.unlink()

    poison_metadata(step, sandbox.marker)
    pickle.loads((step / ".metadata").read_bytes())
    assert sandbox.marker.exists(), "unpickling .metadata did not run the payload"
    sandbox.marker.unlink()
    pickle.loads(pickle.dumps(Payload(sandbox.marker)))
    assert sandbox.marker.exists()


# ----------------------------------------------------------------------------------------------
# what must keep working (positive cases, separate from the sweep)

POSITIVE_ROWS: dict[str, str] = {
    "config-check-shipped-jobs": "test_config_check_passes_on_every_shipped_job",
    "job-file-is-code": "test_job_files_are_documented_as_code_and_config_check_runs_none",
    "metrics-twice-after-resume": "test_resume_after_a_crash_keeps_each_step_once",
    "plan-charlm": "test_plan_charlm_is_runnable_and_fills_the_share",
    "find-batch-global": "test_find_batch_answers_for_the_global_batch",
}
"""Context rows covered by a positive test below (row -> test)."""


@pytest.mark.parametrize(
    "config", sorted(p.name for p in (REPO_ROOT / "configs").glob("*.yaml")), ids=str
)
def test_config_check_passes_on_every_shipped_job(
    config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = _run_cli(["config", "check", str(REPO_ROOT / "configs" / config)], capsys)
    assert outcome.code == 0, outcome.err
    assert outcome.err == ""
    assert "task: charlm" in outcome.out and "effective batch" in outcome.out


def test_job_files_are_documented_as_code_and_config_check_runs_none(
    sandbox: Sandbox, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = (REPO_ROOT / "docs" / "checkpointing.md").read_text()
    assert "## Trust model" in docs and "**A job file is code**" in docs
    for command in ("train", "launch"):
        text = " ".join(_run_cli([command, "--help"], capsys).out.split())
        assert "is code" in text and "import strings" in text, command
    marker = sandbox.marker
    job = sandbox.write(
        "job.yaml",
        json.dumps(
            {
                "task": "os:system",
                "task_options": {"command": f"touch {marker}"},
                "training": {"global_batch_size": 16, "per_device_batch_size": 8},
            }
        ),
    )
    outcome = _run_cli(["config", "check", str(job)], capsys)
    assert outcome.code == 0, outcome.err
    assert not marker.exists(), "config check ran the job file's import string"


def test_resume_after_a_crash_keeps_each_step_once(sandbox: Sandbox) -> None:
    """A run killed after logging step 4 but before committing its checkpoint resumes from
    step 2: the steps it logs again replace the old lines. A changed ``run.log_every`` only
    warns (it does not change the math)."""
    run = sandbox.root / "out"
    shutil.copytree(sandbox.source_run("plain"), run)
    shutil.rmtree(run / "checkpoints" / STEPS[-1])  # the crash: step 4 was never committed
    kept = snapshot(run / "checkpoints" / STEPS[0])
    job = sandbox.job("plain", {"run.log_every": 2})
    done = run_python(["-m", "gpu_training", "train", str(job)], timeout=120, cwd=sandbox.root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "run.log_every: 1 -> 2" in done.stdout + done.stderr
    assert "does not change the math" in done.stdout + done.stderr
    assert snapshot(run / "checkpoints" / STEPS[0]) == kept, "the resumed-from checkpoint changed"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if r.get("split") == "train"]
    assert train_steps == sorted(set(train_steps)), f"steps logged twice: {train_steps}"
    assert train_steps[-1] == 4, train_steps


def test_plan_charlm_is_runnable_and_fills_the_share(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "charlm", "--gpu-memory", "80", "--gpus", "2", "--global-batch", "32"]
    outcome = _run_cli([*args, "--json"], capsys)
    assert outcome.code == 0, outcome.err
    report = json.loads(outcome.out)
    batch = report["batch"]
    assert (batch["per_device"], batch["gradient_accumulation_steps"]) == (16, 1), batch
    assert "train charlm" not in json.dumps(report["launch"])


def test_find_batch_answers_for_the_global_batch(capsys: pytest.CaptureFixture[str]) -> None:
    config = REPO_ROOT / "configs" / "ddp_config.yaml"
    outcome = _run_cli(["find-batch", str(config), "--gpu-memory", "80"], capsys)
    assert outcome.code == 0, outcome.err
    assert "per-device 32 x accumulation 1 x 1 rank = global 32" in outcome.out
    assert "--set training.per_device_batch_size=32" in outcome.out
