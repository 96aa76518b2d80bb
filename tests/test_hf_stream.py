"""``task: hf`` on a stream: each record tokenized on the fly into one window, resumed exactly.

The task's stream is the toolkit's global sample cursor over the files (one window per
record, a window's id its record's index), so it resumes as every stream does: on the same
world size the same ids per rank and step and the weights bitwise; on another world size no
id repeated or skipped. Checked on the components (ranks simulated in one process, real
DataLoader workers; the negative control restarts the stream and fails the check) and on
real runs of a tiny Llama through ``train`` on 2 ranks with 2 workers, resumed on 2 and on 1
(and in ``make test-matrix`` the real runs' negative control: a resume whose stream restarts).
Nothing is tokenized ahead of time: no token cache is written.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from gpu_training.config import ConfigError
from gpu_training.tasks import resolve_task
from gpu_training.tasks.hf_options import HFTaskOptions
from hf_runs import LLAMA, TOKENIZER
from resume_jobs import weights
from stream_task import ID_CHARS, flat, read_steps, simulated_steps, write_stream
from train_jobs import train

pytest.importorskip("transformers")

G, B, STEPS = 8, 2, 6


def _options(stream: Path, tmp: Path, **more: Any) -> dict[str, Any]:
    return {
        "config": dict(LLAMA),
        "tokenizer": str(TOKENIZER),
        "stream": str(stream),
        "block_size": 16,
        "cache_dir": str(tmp / "cache"),
        **more,
    }


def _id(inputs: torch.Tensor) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    return int(tokenizer.decode(inputs[: 2 * ID_CHARS].tolist())[:ID_CHARS])


class _Restart:
    """The negative control: every pass reads the stream from its start."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def records(self, start: int) -> Any:
        return self.stream.records(0)

    def decode(self, record: Any) -> Any:
        return self.stream.decode(record)


def _steps(stream: Any, world: int, workers: int, steps: int, state: Any = None) -> tuple:
    """``steps`` global steps on ``world`` simulated ranks: per step, per rank, the ids."""
    return simulated_steps(
        stream,
        world,
        workers,
        steps,
        state,
        global_batch=G,
        per_device=B,
        ids=lambda batch: [_id(row) for row in batch[0]],
    )


def test_the_stream_is_tokenized_on_the_fly_and_resumes_on_any_world_size(tmp_path: Path) -> None:
    lines = write_stream(tmp_path / "s.jsonl", 60)
    train_set, val = resolve_task("hf", _options(lines, tmp_path)).build_data()
    assert val is None and not (tmp_path / "cache").exists()  # nothing tokenized ahead
    kind, raw, _ = next(train_set.records(5))
    assert kind == "jsonl" and isinstance(raw, bytes)  # a record is read raw, decoded late
    inputs, targets = train_set.decode((kind, raw, (lines, 6)))
    assert inputs.shape == targets.shape == (16,) and _id(inputs) == 5
    assert torch.equal(inputs[1:], targets[:-1])  # a window of 17 tokens, shifted by one

    first, state = _steps(train_set, 2, 2, 2)
    assert [flat(s) for s in first] == [list(range(k * G, (k + 1) * G)) for k in range(2)]
    for world, workers in ((1, 0), (2, 1)):
        rest, _ = _steps(train_set, world, workers, 2, state)
        assert [flat(s) for s in rest] == [list(range(k * G, (k + 1) * G)) for k in (2, 3)]
    restarted, _ = _steps(_Restart(train_set), 1, 0, 2, state)  # the negative control
    assert [flat(s) for s in restarted] == [flat(s) for s in first]


def test_a_short_record_pads_unscored_and_a_long_one_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("000007 a\n" + "000008 " + "word " * 40 + "\n")
    train_set, _ = resolve_task("hf", _options(path, tmp_path)).build_data()
    (_, short_t), (long_in, long_t) = (train_set.decode(r) for r in train_set.records(0))
    scored = int((short_t != -100).sum())
    assert 0 < scored < 16 and (short_t[scored:] == -100).all()  # the padding is not scored
    assert short_t[scored - 1].item() == LLAMA["eos_token_id"]  # the record ends with EOS
    assert (long_t != -100).all() and _id(long_in) == 8


def test_stream_options_are_checked_in_one_line(tmp_path: Path) -> None:
    lines = write_stream(tmp_path / "s.jsonl", 4)
    both = _options(lines, tmp_path, train_files=[str(lines)])
    with pytest.raises(ConfigError, match=r"task_options.stream': give train_files .* not both"):
        HFTaskOptions.from_mapping(both)
    with pytest.raises(ConfigError, match=r"'task_options.stream_reader': expected files or hf"):
        HFTaskOptions.from_mapping(_options(lines, tmp_path, stream_reader="arrow"))
    with pytest.raises(ConfigError, match=r"'task_options.stream_workers': expected an integer"):
        HFTaskOptions.from_mapping(_options(lines, tmp_path, stream_workers=True))
    instruction = _options(lines, tmp_path, prompt_field="q", response_field="a")
    with pytest.raises(ConfigError, match="instruction data needs train_files"):
        HFTaskOptions.from_mapping(instruction)
    with pytest.raises(ConfigError, match="no such file or directory"):
        resolve_task("hf", _options(tmp_path / "absent", tmp_path)).build_data()


# --- real runs: a tiny Llama through train on 2 ranks, resumed on 2 and on 1 ------------------


def _job(tmp: Path, out: Path, stream: Path, **options: Any) -> Path:
    job = {
        "task": "stream_task:hf_recording_task",
        "task_options": {
            "record_dir": str(tmp / "ids_live"),
            **_options(stream, tmp, stream_workers=2),
            **options,
        },
        "training": {
            "global_batch_size": G,
            "per_device_batch_size": B,
            "learning_rate": 3e-3,
            "warmup_steps": 1,
            "max_steps": STEPS,
            "precision": "fp32",
            "seed": 5,
        },
        "strategy": {"name": "ddp"},
        "checkpoint": {"every": 3, "keep_last_n": 5},
        "run": {
            "output_dir": str(out),
            "log_every": 3,
            "eval_every": 100,
            "plot": False,
            "tensorboard": False,
            "progress": False,
        },
    }
    path = tmp / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _train(path: Path, world: int, out: Path, *args: str) -> list:
    live = path.parent / "ids_live"
    shutil.rmtree(live, ignore_errors=True)
    live.mkdir()
    printed = train(path, world, *args)
    shutil.move(live, out / "ids")
    assert world == 2 or "resumed from" in printed
    return read_steps(out / "ids", world, G // (world * B))


def _resume(run: Path, name: str, world: int, *args: str) -> tuple[list, dict[str, torch.Tensor]]:
    """``run``'s step-3 checkpoint resumed on ``world`` ranks: its steps 4..6 and weights."""
    tmp = run.parent
    out = tmp / name
    shutil.copytree(run, out, ignore=shutil.ignore_patterns("step-00000006", "ids"))
    return _train(_job(tmp, out, tmp / "stream.jsonl"), world, out, *args), weights(out, STEPS)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """6 steps on 2 ranks, 2 workers each, a checkpoint every 3: its dir and ids per step."""
    tmp = tmp_path_factory.mktemp("hf_stream")
    stream = write_stream(tmp / "stream.jsonl", 100)
    run = tmp / "run"
    whole = _train(_job(tmp, run, stream), 2, run)
    assert [sorted(flat(s)) for s in whole] == [
        list(range(k * G, (k + 1) * G)) for k in range(STEPS)
    ]
    assert not (tmp / "cache").exists()  # nothing tokenized ahead of time
    return run, whole


@pytest.mark.slow
@pytest.mark.multirank
def test_hf_stream_resumes_exactly_through_train(uninterrupted: tuple[Path, list]) -> None:
    run, whole = uninterrupted
    final = weights(run, STEPS)
    # the same world size, another worker count: the same ids per rank and step, bitwise
    same, same_weights = _resume(run, "same", 2, "--set", "task_options.stream_workers=1")
    assert same == whole[3:]
    assert all(torch.equal(final[k], same_weights[k]) for k in final)
    # one rank: per step the same global set, no id repeated or skipped
    one, one_weights = _resume(run, "one", 1, "--set", "task_options.stream_workers=0")
    assert [sorted(flat(s)) for s in one] == [sorted(flat(s)) for s in whole[3:]]
    assert Counter(i for s in whole[:3] + one for i in flat(s)) == Counter(range(STEPS * G))
    assert max((one_weights[k] - final[k]).abs().max().item() for k in final) < 1e-5


@pytest.mark.matrix
@pytest.mark.multirank
def test_a_resume_that_restarts_the_stream_fails_the_same_checks(
    uninterrupted: tuple[Path, list],
) -> None:
    """The real runs' negative control (make test-matrix; make test has the components')."""
    run, whole = uninterrupted
    sets = ("--allow-config-change", "--set", "task_options.restart=true")
    again, again_weights = _resume(run, "restart", 2, *sets)
    assert again == whole[:3] != whole[3:]
    final = weights(run, STEPS)
    assert not all(torch.equal(final[k], again_weights[k]) for k in final)


def test_the_guides_stream_job_is_a_valid_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/huggingface.md's streamed job: its options check, its training section loads."""
    from dist_harness import REPO_ROOT
    from gpu_training.job import JobConfig

    text = (REPO_ROOT / "docs" / "huggingface.md").read_text()
    blocks = [b for b in text.split("```yaml\n")[1:] if "stream:" in b.split("```")[0]]
    assert len(blocks) == 1
    job = yaml.safe_load(blocks[0].split("```")[0])
    monkeypatch.chdir(REPO_ROOT)  # the guide's paths are the repository's
    options = HFTaskOptions.from_mapping(job["task_options"])
    assert options.stream == "data/shards/" and options.stream_workers == 2
    JobConfig.from_dict(job)
