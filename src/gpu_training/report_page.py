"""``gpu-training report RUN_DIR``: one self-contained HTML page of a run.

What a person would rather look at than read: the loss (train and validation) and throughput
curves, the checkpoints committed, the run's starts and resumes, each rank's step split into
its parts where the run recorded per-rank telemetry, and the stall watchdog's verdicts. The
page carries its data as JSON and draws its charts with a few lines of inline JavaScript into
SVG: no network, no library, one file to attach to a bug report. Everything is read from the
run directory (``metrics.jsonl``, ``events.jsonl``, ``checkpoints/*/manifest.json``,
``telemetry/``, ``flight_recorder/``); nothing is unpickled.

Example:
    >>> import json, tempfile, pathlib
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> rows = [{"split": "train", "step": s, "loss": 5.0 - s / 10, "tokens_per_s": 900.0}
    ...         for s in (10, 20)]
    >>> _ = (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
    >>> html = render_report(run)
    >>> "<svg" not in html and '"loss": [4.0, 3.0]' in html  # the browser draws the SVG
    True
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ReportError", "collect_run", "render_report", "write_report"]


class ReportError(ValueError):
    """The directory is not a run directory (no ``metrics.jsonl``) or cannot be read."""


def _jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if not path.is_file():
        return rows
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a crash: the rest still tells
            continue
        if isinstance(record, dict):
            rows.append(record)
    return rows


def _series(rows: list[dict[str, Any]], split: str, key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for row in rows:
        if row.get("split") == split and isinstance(row.get(key), (int, float)):
            steps.append(int(row["step"]))
            values.append(float(row[key]))
    return steps, values


def _checkpoints(run: Path) -> list[dict[str, Any]]:
    found = []
    for manifest in sorted((run / "checkpoints").glob("step-*/manifest.json")):
        try:
            data = json.loads(manifest.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        size = sum(int(f.get("size", 0)) for f in data.get("files", []) if isinstance(f, dict))
        found.append(
            {
                "step": data.get("step"),
                "created": data.get("created", ""),
                "world_size": data.get("world_size"),
                "mib": round(size / 2**20, 2),
                "directory": manifest.parent.name,
            }
        )
    return found


_PARTS = ("data_ms", "compute_ms", "comm_ms", "optimizer_ms", "checkpoint_ms")
"""The parts of a step the timeline stacks (``gpu_training.telemetry.StepRecord``'s)."""


def _telemetry(run: Path) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """Each rank's last 200 step records (the parts and the arrival), and the straggler
    verdict over the last steps, from ``telemetry/rank*.jsonl``."""
    from gpu_training.telemetry import read_rank_logs, straggler

    logs = read_rank_logs(run)
    ranks = {
        str(rank): [
            {"step": r.step, "arrival_ms": r.arrival_ms, **{p: getattr(r, p) for p in _PARTS}}
            for r in log.steps[-200:]
        ]
        for rank, log in sorted(logs.items())
        if log.steps
    }
    verdict: dict[str, Any] = {}
    if len(ranks) > 1:
        found = straggler({rank: log.steps for rank, log in logs.items() if log.steps})
        verdict = {"message": found.message, "rank": found.rank, "lags_ms": found.lags_ms}
    return ranks, verdict


def _stalls(run: Path) -> list[dict[str, str]]:
    found = []
    for path in sorted((run / "flight_recorder").glob("verdict-rank*.txt")):
        found.append({"rank": path.stem.removeprefix("verdict-rank"), "verdict": path.read_text()})
    return found


def collect_run(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Everything the page shows, as plain data (also what ``--json`` would print).

    Raises:
        ReportError: Without a ``metrics.jsonl`` in ``run_dir``.
    """
    run = Path(run_dir)
    metrics = run / "metrics.jsonl"
    if not run.is_dir():
        raise ReportError(f"{run}: no such directory (give a run's output_dir)")
    if not metrics.is_file():
        raise ReportError(
            f"{run}: no metrics.jsonl here: not a run's output directory (run.output_dir)"
        )
    rows = _jsonl(metrics)
    train_steps, train_loss = _series(rows, "train", "loss")
    val_steps, val_loss = _series(rows, "val", "loss")
    rate_key = "tokens_per_s" if any("tokens_per_s" in r for r in rows) else "samples_per_s"
    rate_steps, rate = _series(rows, "train", rate_key)
    mfu_steps, mfu = _series(rows, "train", "mfu")
    telemetry, verdict = _telemetry(run)
    return {
        "run": str(run.resolve()),
        "steps": max(train_steps, default=0),
        "train": {"step": train_steps, "loss": train_loss},
        "val": {"step": val_steps, "loss": val_loss},
        "rate": {"step": rate_steps, "value": rate, "unit": rate_key.replace("_per_s", "/s")},
        "mfu": {"step": mfu_steps, "value": mfu},
        "checkpoints": _checkpoints(run),
        "events": _jsonl(run / "events.jsonl"),
        "telemetry": telemetry,
        "straggler": verdict,
        "stalls": _stalls(run),
    }


_SCRIPT = """
const data = JSON.parse(document.getElementById("run-data").textContent);
const PARTS = ["data_ms", "compute_ms", "comm_ms", "optimizer_ms", "checkpoint_ms"];
const NS = "http://www.w3.org/2000/svg";
function el(tag, attrs, parent) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}
function chart(id, title, lines) {
  const box = document.getElementById(id);
  const W = 640, H = 220, L = 56, B = 28;
  const all = lines.flatMap(l => l.y.map((y, i) => [l.x[i], y])).filter(p => isFinite(p[1]));
  const svg = el("svg", {id: id + "-svg", width: W, height: H, viewBox: `0 0 ${W} ${H}`}, box);
  el("text", {x: L, y: 14, class: "title"}, svg).textContent = title;
  if (!all.length) { el("text", {x: L, y: H / 2}, svg).textContent = "no data"; return; }
  const xs = all.map(p => p[0]), ys = all.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (y1 === y0) { y0 -= 1; y1 += 1; }
  const px = x => L + (x - x0) / (x1 - x0) * (W - L - 10);
  const py = y => H - B - (y - y0) / (y1 - y0) * (H - B - 24);
  el("line", {x1: L, y1: H - B, x2: W - 10, y2: H - B, class: "axis"}, svg);
  el("line", {x1: L, y1: 20, x2: L, y2: H - B, class: "axis"}, svg);
  for (const [v, y] of [[y1, py(y1)], [y0, py(y0)]])
    el("text", {x: 4, y: y + 4, class: "tick"}, svg).textContent = v.toPrecision(4);
  el("text", {x: px(x0), y: H - 8, class: "tick"}, svg).textContent = "step " + x0;
  el("text", {x: px(x1), y: H - 8, class: "tick", "text-anchor": "end"}, svg).textContent = "step " + x1;
  lines.forEach((l, n) => {
    const pts = l.x.map((x, i) => [x, l.y[i]]).filter(p => isFinite(p[1]));
    if (!pts.length) return;
    const d = pts.map((p, i) => (i ? "L" : "M") + px(p[0]).toFixed(1) + " " + py(p[1]).toFixed(1)).join(" ");
    el("path", {d: d, class: "line s" + n, "data-points": pts.length, "data-name": l.name}, svg);
    el("text", {x: W - 140, y: 30 + 14 * n, class: "legend s" + n}, svg).textContent = l.name;
  });
}
function timeline(id) {
  const box = document.getElementById(id);
  const ranks = Object.keys(data.telemetry);
  if (!ranks.length) { box.textContent = "no per-rank telemetry in this run"; return; }
  const parts = PARTS;
  const means = ranks.map(r => {
    const rows = data.telemetry[r];
    return parts.map(p => rows.reduce((a, s) => a + (s[p] || 0), 0) / rows.length);
  });
  const W = 640, row = 26, L = 70, scale = Math.max(...means.map(m => m.reduce((a, b) => a + b, 0)), 1e-9);
  const svg = el("svg", {id: id + "-svg", width: W, height: row * ranks.length + 40}, box);
  ranks.forEach((r, i) => {
    el("text", {x: 4, y: 20 + i * row + 14, class: "tick"}, svg).textContent = "rank " + r;
    let x = L;
    means[i].forEach((ms, j) => {
      const w = ms / scale * (W - L - 10);
      const bar = el("rect", {x: x, y: 20 + i * row, width: Math.max(w, 0), height: row - 6, class: "s" + j,
                              "data-rank": r, "data-part": parts[j], "data-ms": ms.toFixed(3)}, svg);
      el("title", {}, bar).textContent = `rank ${r} ${parts[j]}: ${ms.toFixed(2)} ms`;
      x += w;
    });
  });
  parts.forEach((p, j) => el("text", {x: L + j * 100, y: 14, class: "legend s" + j}, svg).textContent = p);
}
chart("loss", "loss", [{name: "train", x: data.train.step, y: data.train.loss},
                        {name: "validation", x: data.val.step, y: data.val.loss}]);
chart("rate", "throughput (" + data.rate.unit + ")", [{name: data.rate.unit, x: data.rate.step, y: data.rate.value}]);
if (data.mfu.value.length) chart("mfu", "MFU", [{name: "MFU", x: data.mfu.step, y: data.mfu.value}]);
timeline("timeline");
document.body.setAttribute("data-rendered", "yes");
"""

_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 3px 8px; }
.axis { stroke: #888; } .tick { font-size: 11px; fill: #555; } .title { font-weight: bold; }
.line { fill: none; stroke-width: 2; } path.s0 { stroke: #1f77b4; } path.s1 { stroke: #ff7f0e; }
rect.s0 { fill: #1f77b4; } rect.s1 { fill: #ff7f0e; } rect.s2 { fill: #2ca02c; }
rect.s3 { fill: #d62728; } rect.s4 { fill: #9467bd; } rect.s5 { fill: #8c564b; }
text.legend { font-size: 12px; } text.s0 { fill: #1f77b4; } text.s1 { fill: #ff7f0e; }
text.s2 { fill: #2ca02c; } text.s3 { fill: #d62728; } text.s4 { fill: #9467bd; } pre { white-space: pre-wrap; background: #f6f6f6; padding: 8px; }
"""


def _table(rows: list[Mapping[str, Any]], columns: list[str], table_id: str) -> str:
    if not rows:
        return f'<p id="{table_id}">none</p>'
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in columns) + "</tr>"
        for r in rows
    )
    return f'<table id="{table_id}"><tr>{head}</tr>{body}</table>'


def render_report(run_dir: str | os.PathLike[str]) -> str:
    """The page of the run in ``run_dir``, as one HTML string (see the module's docstring).

    Raises:
        ReportError: Without a ``metrics.jsonl`` in ``run_dir``.
    """
    data = collect_run(run_dir)
    payload = json.dumps(data).replace("</", "<\\/")  # a run path cannot close the script
    stalls = "".join(
        f"<p>rank {html.escape(s['rank'])}:</p><pre>{html.escape(s['verdict'])}</pre>"
        for s in data["stalls"]
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>gpu-training report: {html.escape(data["run"])}</title>
<style>{_STYLE}</style></head>
<body>
<h1>gpu-training report</h1>
<p>{html.escape(data["run"])}: {data["steps"]} steps logged</p>
<h2>Loss</h2><div id="loss"></div>
<h2>Throughput</h2><div id="rate"></div><div id="mfu"></div>
<h2>Per-rank step time (mean of the recorded steps)</h2><div id="timeline"></div>
<p id="straggler">{html.escape(data["straggler"].get("message", "one rank, or no per-rank telemetry"))}</p>
<h2>Checkpoints</h2>
{_table(data["checkpoints"], ["step", "created", "world_size", "mib", "directory"], "checkpoints")}
<h2>Starts and resumes</h2>
{_table(data["events"], ["event", "step", "time"], "events")}
<h2>Stalls</h2>
{stalls or '<p id="stalls">none</p>'}
<script type="application/json" id="run-data">{payload}</script>
<script>{_SCRIPT}</script>
</body></html>
"""


def write_report(
    run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None
) -> Path:
    """Write the page (default ``RUN_DIR/report.html``) atomically and return its path.

    Raises:
        ReportError: Without a ``metrics.jsonl`` in ``run_dir``.
    """
    page = render_report(run_dir)
    target = Path(out) if out is not None else Path(run_dir) / "report.html"
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, target)
    return target
