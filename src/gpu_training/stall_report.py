"""What a stalled rank reports: where its main thread is, and the verdict across ranks.

When the :class:`~gpu_training.watchdog.StallWatchdog` fires, each rank classifies its own
main thread (:func:`frame_state`: busy in the program's code, waiting in a collective, in
backward), publishes that note in the job's rendezvous store (:func:`publish_state`), reads
the other ranks' notes (:func:`collect_states`), judges which ranks are stalled
(:func:`stall_verdict`) and writes the verdict as torchrun's error record
(:func:`record_stall_error`), all gathered in a :class:`StallReport`. A rank whose training
loop raised leaves a note too (:func:`raised_state`), so a rank that failed is not reported
as one that is stuck. These helpers are the watchdog's; only :class:`StallReport` is API.
No torch import: the store is handed in.

Example:
    >>> states = {0: {"state": "busy", "op": "", "where": "train.py:42 in step"},
    ...           1: {"state": "collective", "op": "all_reduce", "where": "train.py:50 in sync"}}
    >>> culprits, text = stall_verdict(states, 2, 30)
    >>> culprits, text.split(";")[0]
    ([0], 'rank 0 stalled at train.py:42 in step (no step progress for 30s, not in a collective)')
"""

from __future__ import annotations

import contextlib
import json
import os
import sysconfig
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from gpu_training.failure import one_line, write_error_record

__all__ = ["StallReport"]


@dataclass
class StallReport:
    """What the watchdog found when it fired.

    Attributes:
        rank: The rank that wrote this report.
        stalled_for: Seconds since this rank's last tick.
        last_step: The step of the last tick (None: never ticked).
        states: Rank → ``{"state": "raised" | "busy" | "collective" | "backward", "where":
            ..., "op": ..., "step": ...}`` as the ranks reported them (``op`` of a rank that
            raised: its exception, one line).
        culprits: The ranks judged at fault: raised, busy in their own code, or silent.
        message: The verdict, one paragraph.
    """

    rank: int
    stalled_for: float
    last_step: int | None
    states: dict[int, dict[str, Any]] = field(default_factory=dict)
    culprits: list[int] = field(default_factory=list)
    message: str = ""


# --- where a rank is, and the verdict ---------------------------------------------------------


def frame_location(frame: FrameType) -> str:
    """``file:line in function`` of a frame."""
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def torch_part(path: str) -> str | None:
    """``"distributed"``, ``"autograd"`` or ``"other"`` for a file of torch, else None."""
    marker = f"{os.sep}torch{os.sep}"
    if marker not in path:
        return None
    rest = path.split(marker, 1)[1]
    if rest.startswith("distributed") and f"{os.sep}elastic{os.sep}" not in rest:
        return "distributed"
    return "autograd" if rest.startswith("autograd") else "other"


_TIMING_HOOKS = f"{os.sep}gpu_training{os.sep}telemetry{os.sep}"
"""The telemetry's timed collectives sit between torch's frames: a wait in them is torch's."""


def _inside_torch(path: str) -> bool:
    return torch_part(path) is not None or _TIMING_HOOKS in path


def frame_state(frame: FrameType | None, skip_file: str = "") -> dict[str, Any]:
    """Classify a stack: waiting in a collective, in backward, or busy in the program's code.

    Only the innermost frames count: a thread blocked in ``all_reduce`` has torch's
    collective frames on top of its stack; one stuck in the program (a loop, a sleep, a data
    loader) has the program's frames (or other torch code) there. A busy thread is placed at
    its innermost frame outside torch and outside ``skip_file`` (the watchdog's own module).
    """
    frames: list[FrameType] = []
    while frame is not None:
        frames.append(frame)  # innermost first
        frame = frame.f_back
    run = 0
    while run < len(frames) and _inside_torch(frames[run].f_code.co_filename):
        run += 1
    parts = [torch_part(f.f_code.co_filename) for f in frames[:run]]
    caller = frames[run] if run < len(frames) else (frames[-1] if frames else None)
    if "distributed" in parts:
        api = [
            f
            for f, part in zip(frames[:run], parts, strict=True)
            if part == "distributed" and f.f_code.co_name != "wrapper"
        ]
        op = api[-1].f_code.co_name if api else "a collective"
        return {"state": "collective", "op": op, "where": frame_location(caller) if caller else "?"}
    if "autograd" in parts:
        where = frame_location(caller) if caller else "?"
        return {"state": "backward", "op": "backward (DDP gradient all-reduce)", "where": where}
    outside = [
        f
        for f in frames
        if not _inside_torch(f.f_code.co_filename) and f.f_code.co_filename != skip_file
    ]
    # the program's own line, not the stdlib's (a queue's select() under a DataLoader)
    mine = next((f for f in outside if not _in_stdlib(f.f_code.co_filename)), None)
    mine = mine or (outside[0] if outside else (frames[0] if frames else None))
    inner = frames[: frames.index(mine)] if mine in frames else []
    loader = any(_DATALOADER in f.f_code.co_filename for f in inner)
    op = "its DataLoader (a worker process is stuck or slow)" if loader else ""
    return {"state": "busy", "op": op, "where": frame_location(mine) if mine else "?"}


_DATALOADER = f"{os.sep}torch{os.sep}utils{os.sep}data{os.sep}"
_STDLIB = tuple(
    {
        os.path.normcase(p) + os.sep
        for p in (sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"))
    }
)


def _in_stdlib(path: str) -> bool:
    """True for a file of Python's standard library (not of site-packages)."""
    normal = os.path.normcase(path)
    return normal.startswith(_STDLIB) and "site-packages" not in normal


def raised_state(exc: BaseException, skip_file: str = "") -> dict[str, Any]:
    """The note of a rank whose loop raised ``exc``: where (innermost frame outside torch)."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    mine = [
        (code, line)
        for code, line in frames
        if torch_part(code.co_filename) is None and code.co_filename != skip_file
    ]
    chosen = mine or frames
    where = "?"
    if chosen:
        code, line = chosen[-1]
        where = f"{code.co_filename}:{line} in {code.co_name}"
    error = one_line(exc, limit=300)
    return {"state": "raised", "op": error, "where": where}


def stall_verdict(
    states: Mapping[int, Mapping[str, Any]], world: int, timeout: float
) -> tuple[list[int], str]:
    """The stalled ranks (busy in their own code, or silent) and the verdict naming them."""
    raised = sorted(r for r, s in states.items() if s["state"] == "raised")
    busy = sorted(r for r, s in states.items() if s["state"] == "busy")
    missing = sorted(set(range(world)) - set(states))
    waiting = sorted(r for r, s in states.items() if s["state"] in ("collective", "backward"))

    def waits(ranks: list[int]) -> str:
        return "; ".join(
            f"rank {r} waiting in {states[r]['op']} at {states[r]['where']}" for r in ranks
        )

    culprits = raised + busy + missing
    parts = []
    if raised:
        parts.append(
            "; ".join(f"rank {r} raised {states[r]['op']} at {states[r]['where']}" for r in raised)
            + " (it failed, it is not stuck: its traceback is in its log)"
        )
    if busy:
        parts.append(
            "; ".join(
                f"rank {r} stalled at {states[r]['where']}"
                + (f", waiting for {states[r]['op']}" if states[r].get("op") else "")
                for r in busy
            )
            + f" (no step progress for {timeout:g}s, not in a collective)"
        )
    if missing:
        parts.append(
            f"rank(s) {missing} did not answer (stuck in native code holding the GIL, or dead)"
        )
    if culprits and waiting:
        parts.append(f"the others wait for it: {waits(waiting)}")
    if not culprits:
        ops = {states[r]["op"] for r in waiting}
        if len(ops) > 1:
            parts.append(
                "every rank is waiting, in different collectives (the ranks called different "
                f"operations): {waits(waiting)}"
            )
        else:
            parts.append(
                f"every rank is waiting in {ops.pop() if ops else '?'}: a rank that skipped "
                f"it earlier, or the network (NCCL_DEBUG=INFO): {waits(waiting)}"
            )
    answered = {r: s["collectives"] for r, s in states.items() if s.get("collectives")}
    if len(answered) > 1:  # the flight recorder's view: who is in which collective
        from gpu_training.flight_recorder import collective_verdict

        where = {r: str(s.get("where", "?")) for r, s in states.items()}
        seen = collective_verdict(answered, where)
        if seen:
            parts.append(f"flight recorder: {seen}")
    return culprits, "; ".join(parts)


# --- notes between ranks and torchrun's record ------------------------------------------------


def publish_state(store: Any, key: str, state: Mapping[str, Any]) -> None:
    """Put this rank's note under ``key`` in the store (nothing without one)."""
    if store is None:
        return
    with contextlib.suppress(Exception):  # a store that is gone: the report stays local
        store.set(key, json.dumps(state))


def collect_states(store: Any, key: str, world: int, grace: float) -> dict[int, dict[str, Any]]:
    """The notes of every rank that published within ``grace`` seconds."""
    deadline = time.monotonic() + grace
    found: dict[int, dict[str, Any]] = {}
    while True:
        for rank in range(world):
            if rank in found:
                continue
            name = f"{key}/rank{rank}"
            try:
                if store.check([name]):
                    found[rank] = json.loads(store.get(name))
            except Exception:
                continue
        if len(found) == world or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def record_stall_error(report: StallReport, *, first: bool) -> None:
    """Write the verdict as torchrun's error record of this rank (``TORCHELASTIC_ERROR_FILE``)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    stack = report.states.get(report.rank, {}).get("where", "?")
    data = {
        "message": {
            "message": f"StallError: {report.message}",
            "extraInfo": {
                "py_callstack": f"StallError (watchdog) on rank {report.rank} at {stack}\n"
                f"{report.message}\n",
                # torchrun's root cause is the earliest record: stalled ranks go first.
                "timestamp": str(int(time.time()) + (0 if first else 1)),
            },
        }
    }
    write_error_record(path, data)  # atomic: torchrun reads it as soon as the rank is gone
