"""``gpu-training report``: a real run's page, rendered by Debian's chromium (headless).

The page draws its charts with inline JavaScript, so what is checked is the DOM *after* the
scripts ran (``chromium --dump-dom``) and a screenshot, by structure: the loss chart has one
point per logged step, the checkpoints and the run's start and resume are listed, each rank
has its bar, and the picture is not blank. ``make test`` installs chromium
(``.ci/install-chromium``); without it the browser tests skip, saying so.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpu_training.cli import main
from gpu_training.report_page import render_report
from train_jobs import train

CHROMIUM = shutil.which("chromium")
_BROWSER = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed: make test installs it (.ci/install-chromium, Debian, root)",
)
# The flags a closed network needs (background connections are refused, many at a time).
_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


STEPS = 12
DELAY_MS = 150.0


def _job_file(tmp: Path, out: Path) -> Path:
    """2 DDP ranks, rank 1 slow in its data (tests/slow_rank_task.py), checkpoints every 4."""
    job = {
        "task": "slow_rank_task:make_task",
        "task_options": {"slow_rank": 1, "where": "data", "delay_ms": DELAY_MS},
        "training": {
            "global_batch_size": 4,
            "per_device_batch_size": 2,
            "learning_rate": 3e-3,
            "max_steps": STEPS,
            "precision": "fp32",
        },
        "strategy": {"name": "ddp"},
        "checkpoint": {"every": 4, "keep_last_n": 5},
        "run": {
            "output_dir": str(out),
            "log_every": 2,
            "eval_every": 4,
            "eval_batches": 1,
            "progress": False,
            "plot": False,
            "tensorboard": False,
        },
    }
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-rank run of 12 steps that lost its last checkpoint and resumed from step 8."""
    tmp = tmp_path_factory.mktemp("report")
    out = tmp / "run"
    job = _job_file(tmp, out)
    train(job, 2, timeout=240)
    shutil.rmtree(out / "checkpoints" / f"step-{STEPS:08d}")
    train(job, 2, timeout=240)  # resumes from step 8
    return out


def _chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, *_FLAGS, f"--user-data-dir={tmp / 'profile'}", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_the_page_is_one_file_that_needs_no_network(run_dir: Path) -> None:
    assert main(["report", str(run_dir)]) == 0
    page = (run_dir / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?https?:""", page)  # nothing fetched
    assert "@import" not in page and "<link" not in page
    data = json.loads(re.search(r'id="run-data">(.*?)</script>', page, re.S)[1])  # type: ignore[index]
    assert data["train"]["step"] == [2, 4, 6, 8, 10, 12]
    assert [c["step"] for c in data["checkpoints"]] == [4, 8, 12]
    assert [(e["event"], e["step"]) for e in data["events"]] == [("start", 0), ("resume", 8)]


@_BROWSER
@pytest.mark.timeout(180)
def test_chromium_renders_the_curves_tables_and_ranks(run_dir: Path, tmp_path: Path) -> None:
    page = run_dir / "report.html"
    page.write_text(render_report(run_dir))
    proc = _chromium("--dump-dom", page.as_uri(), tmp=tmp_path)
    dom = proc.stdout
    assert 'data-rendered="yes"' in dom, proc.stderr[-2000:]  # the scripts ran to the end
    points = {
        name: int(n) for n, name in re.findall(r'data-points="(\d+)" data-name="([^"]+)"', dom)
    }
    assert points == {"train": 6, "validation": 3, "tokens/s": 6}, points
    assert 'id="loss-svg"' in dom and 'id="rate-svg"' in dom
    bars = {
        (r, p): float(ms)
        for r, p, ms in re.findall(r'data-rank="(\d)" data-part="(\w+)" data-ms="([\d.]+)"', dom)
    }
    parts = ("data_ms", "compute_ms", "comm_ms", "optimizer_ms", "checkpoint_ms")
    assert set(bars) == {(r, p) for r in "01" for p in parts}
    assert bars[("1", "data_ms")] > bars[("0", "data_ms")] + 0.5 * DELAY_MS  # the slow rank
    assert bars[("0", "comm_ms")] > bars[("1", "comm_ms")]  # the fast one waits for it
    verdict = re.search(r'<p id="straggler">(.*?)</p>', dom)
    assert verdict and verdict[1].startswith("rank 1 arrives "), verdict
    assert verdict[1].endswith("its data loading")
    checkpoints = re.search(r'<table id="checkpoints">(.*?)</table>', dom, re.S)
    assert checkpoints and checkpoints[1].count("<tr>") == 4  # the header and steps 4, 8, 12
    events = re.search(r'<table id="events">(.*?)</table>', dom, re.S)
    assert events and "resume" in events[1] and "start" in events[1]


@_BROWSER
@pytest.mark.timeout(180)
def test_the_screenshot_shows_the_charts(run_dir: Path, tmp_path: Path) -> None:
    """By structure: the picture is not blank, and the train curve's blue is drawn in the
    loss chart's place (its top third) and the bars' colours below."""
    from PIL import Image

    page = run_dir / "report.html"
    page.write_text(render_report(run_dir))
    shot = tmp_path / "page.png"
    proc = _chromium(f"--screenshot={shot}", "--window-size=800,1600", page.as_uri(), tmp=tmp_path)
    assert shot.is_file(), proc.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    width, height = image.size
    pixels = image.load()
    blue = [
        y
        for y in range(0, height, 2)
        for x in range(0, width, 2)
        if _near(pixels[x, y], (0x1F, 0x77, 0xB4))
    ]
    assert len(image.getcolors(1 << 20) or []) > 20, "a blank page"
    assert blue and min(blue) < height / 3, "no train curve near the top"
    orange = [
        y
        for y in range(0, height, 2)
        for x in range(0, width, 2)
        if _near(pixels[x, y], (0xFF, 0x7F, 0x0E))
    ]
    assert orange, "no second series (validation, or a bar)"


def _near(pixel: tuple[int, int, int], colour: tuple[int, int, int]) -> bool:
    return sum(abs(a - b) for a, b in zip(pixel, colour, strict=True)) < 40


def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such directory" in err
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no metrics.jsonl here" in err and "Traceback" not in err
    assert not (tmp_path / "report.html").exists()
