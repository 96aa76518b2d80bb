"""PyTorch's flight recorder, read by the stall watchdog: which collective each rank is in.

Every process group records its collectives in a ring buffer when ``TORCH_FR_BUFFER_SIZE``
is set before the group is created (torch 2.13 records gloo as well as NCCL): the
operation, its sequence number in the group, its state and its sizes. When the
:class:`~gpu_training.watchdog.StallWatchdog` fires, each rank takes its own buffer
(:func:`snapshot`), writes it to the run directory, publishes a short summary
(:func:`summarize`) next to its stack note, and :func:`collective_verdict` compares the
ranks' summaries: two ranks in different operations at the same sequence number are a
collective mismatch; a rank whose last sequence number is behind the others' never entered
the collective they wait in. torch ships an analyzer for these dumps
(``torch.distributed.flight_recorder``), which failed on a gloo dump here (a ``KeyError`` on
the process-group key): this module reads the JSON dump itself and needs nothing else.

The recorder is switched on where a watchdog will read it: :func:`enable` (``setdefault``
of the variable, 2000 entries) is called by :func:`~gpu_training.ddp.init_distributed` when
``GPU_TRAINING_STALL_TIMEOUT`` is set and by the Trainer when its job has a stall timeout.

Example:
    >>> ranks = {
    ...     0: {"default_pg": {"seq": 4, "op": "all_reduce", "state": "scheduled"}},
    ...     1: {"default_pg": {"seq": 4, "op": "broadcast", "state": "scheduled"}},
    ... }
    >>> collective_verdict(ranks)
    'a collective mismatch at #4 of default_pg: rank 0 in all_reduce, rank 1 in broadcast'
    >>> ranks[1]["default_pg"] = {"seq": 3, "op": "all_reduce", "state": "completed"}
    >>> collective_verdict(ranks, where={1: "train.py:12 in step"})
    'rank 1 never entered all_reduce #4 of default_pg (its last: all_reduce #3): it is at train.py:12 in step'
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

__all__ = [
    "BUFFER_ENV",
    "DEFAULT_ENTRIES",
    "NCCL_BUFFER_ENV",
    "WATCHDOG_ENV",
    "collective_verdict",
    "enable",
    "snapshot",
    "summarize",
    "write_dump",
]

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
"""torch's variable: the ring buffer's length; 0 or unset records nothing."""

DEFAULT_ENTRIES = 2000
"""Collectives kept per process: a few hundred steps of DDP buckets and the loop's own."""

WATCHDOG_ENV = "GPU_TRAINING_STALL_TIMEOUT"
"""The stall watchdog's variable (:data:`gpu_training.watchdog.STALL_TIMEOUT_ENV`): where it
is set, :func:`~gpu_training.ddp.init_distributed` switches the recorder on."""


NCCL_BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
"""The NCCL process group's older name for the same buffer (torch before 2.13 reads it)."""


def enable(env: MutableMapping[str, str] | None = None, entries: int = DEFAULT_ENTRIES) -> None:
    """Switch the recorder on for process groups created from now on (a set value stays)."""
    target = os.environ if env is None else env
    target.setdefault(BUFFER_ENV, str(entries))
    target.setdefault(NCCL_BUFFER_ENV, target[BUFFER_ENV])


def snapshot() -> dict[str, Any] | None:
    """This process's flight-recorder dump (torch's JSON format), or None without one."""
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:  # a torch built without distributed
        return None
    # NCCL groups keep their own recorder (an empty generic dump on torch 2.11 with NCCL,
    # seen on an H200); gloo's is the generic one. Private functions: absent in some builds.
    found: dict[str, Any] | None = None
    for name in ("_dump_nccl_trace_json", "_dump_fr_trace_json"):
        dump_json = getattr(c10d, name, None)
        if dump_json is None:
            continue
        with contextlib.suppress(Exception):  # no group, no recorder, a format torch changed
            data = json.loads(dump_json(includeCollectives=True))
            if isinstance(data, dict) and data.get("entries"):
                return data
            found = found or (data if isinstance(data, dict) else None)
    return found


def summarize(dump: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The last collective of each process group: ``{group: {"seq", "op", "state"}}``.

    ``op`` drops the backend's prefix (``gloo:all_reduce`` is ``all_reduce``); point-to-point
    operations, which have no collective sequence number, are left out.

    Example:
        >>> summarize({"entries": [
        ...     {"collective_seq_id": 7, "profiling_name": "nccl:all_reduce",
        ...      "state": "completed", "process_group": ["0", "default_pg"]},
        ...     {"collective_seq_id": 8, "profiling_name": "nccl:broadcast",
        ...      "state": "started", "process_group": ["0", "default_pg"]}]})
        {'default_pg': {'seq': 8, 'op': 'broadcast', 'state': 'started'}}
    """
    last: dict[str, dict[str, Any]] = {}
    for entry in (dump or {}).get("entries") or []:
        seq = entry.get("collective_seq_id") or 0
        if not seq:
            continue
        group = entry.get("process_group") or ["", ""]
        name = str(group[1] if len(group) > 1 and group[1] else group[0])
        op = str(entry.get("profiling_name", "?")).split(":", 1)[-1]
        if name not in last or seq >= last[name]["seq"]:
            last[name] = {"seq": int(seq), "op": op, "state": str(entry.get("state", "?"))}
    return last


def collective_verdict(
    ranks: Mapping[int, Mapping[str, Mapping[str, Any]]],
    where: Mapping[int, str] | None = None,
) -> str | None:
    """One sentence from the ranks' :func:`summarize` results, or None when they agree.

    Args:
        ranks: Rank → its summary (only the ranks that answered).
        where: Rank → where its main thread is (the watchdog's stack note), to say what a
            rank that never entered a collective is doing instead.
    """
    where = where or {}
    sentences = []
    groups = sorted({g for summary in ranks.values() for g in summary})
    for group in groups:
        seen = {r: s[group] for r, s in ranks.items() if group in s}
        if len(seen) < 2:
            continue
        top = max(entry["seq"] for entry in seen.values())
        ahead = {r: e for r, e in seen.items() if e["seq"] == top}
        behind = sorted(r for r, e in seen.items() if e["seq"] < top)
        ops: dict[str, list[int]] = {}
        for rank, entry in sorted(ahead.items()):
            ops.setdefault(entry["op"], []).append(rank)
        if len(ops) > 1:
            parts = sorted(ops.items(), key=lambda item: (len(item[1]), item[0]))
            sentences.append(
                f"a collective mismatch at #{top} of {group}: "
                + ", ".join(f"{_ranks(rs)} in {op}" for op, rs in parts)
            )
        if behind:
            op = next(iter(ops)) if len(ops) == 1 else "a collective"
            for rank in behind:
                entry = seen[rank]
                doing = f": it is at {where[rank]}" if rank in where else ""
                sentences.append(
                    f"rank {rank} never entered {op} #{top} of {group} "
                    f"(its last: {entry['op']} #{entry['seq']}){doing}"
                )
    return "; ".join(sentences) or None


def write_dump(directory: str | os.PathLike[str], rank: int, dump: Mapping[str, Any]) -> Path:
    """Write ``dump`` as ``DIRECTORY/flight_recorder/rank{rank}.json`` (atomically)."""
    folder = Path(directory) / "flight_recorder"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"rank{rank}.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(dump, default=str))
    os.replace(tmp, target)
    return target


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}"
