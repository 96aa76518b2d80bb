"""Each rank measures its own steps: :class:`RankTelemetry`.

The loop marks where a step's parts begin and end (:meth:`RankTelemetry.batches` times the
loader, :func:`~gpu_training.step.train_step` marks compute and the optimizer step, the
Trainer marks a save), and :meth:`RankTelemetry.attach` hooks the strategy's gradient
collectives: under DDP the moment backward produces the rank's last gradient (its arrival at
the gradient all-reduce, which then runs until backward returns), under FSDP2 its all-gather
and reduce-scatter through ``set_custom_all_gather`` / ``set_custom_reduce_scatter``
(subclasses of the defaults: the same calls, timed), each noting when the rank *arrives* at
the collective and, through its future, when it completes.

Nothing here waits for the device or adds a collective: a mark is one ``perf_counter`` call
(a collective's, a list append too), a step's record is a tuple built when the next step
starts, and the lines are written at log steps (where the Trainer already syncs) at least a
second apart and before each checkpoint, appended to this rank's own file
(:func:`rank_file`) and flushed, so a crash of the job loses at most about a second of them.
The times are the host's: on CPU ranks they are the work's, on GPUs the host's view of it
(see docs/troubleshooting.md, "A rank is slow").

Example:
    >>> import tempfile, time
    >>> run_dir = tempfile.mkdtemp()
    >>> tel = RankTelemetry(run_dir, rank=0, start={"world_size": 1, "total_steps": 2})
    >>> for step, batch in enumerate(tel.batches([1, 2])):
    ...     tel.compute_started()
    ...     time.sleep(0.002)
    ...     tel.optimizer_started()
    ...     tel.step_done(step + 1)
    >>> tel.close()
    >>> from gpu_training.telemetry import read_rank_logs
    >>> log = read_rank_logs(run_dir)[0]
    >>> [r.step for r in log.steps], log.steps[0].compute_ms >= 2.0, log.start["total_steps"]
    ([1, 2], True, 2)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from gpu_training.telemetry.records import rank_file, step_line

if TYPE_CHECKING:
    from gpu_training.ddp import DistributedContext
    from gpu_training.job import JobConfig

__all__ = ["OFF", "RankTelemetry", "TelemetryOff", "open_telemetry"]

_now = time.perf_counter
_NAN = math.nan


class TelemetryOff:
    """The marks of :class:`RankTelemetry` doing nothing (telemetry off, or a hand-written loop)."""

    def compute_started(self) -> None:
        """Nothing."""

    def optimizer_started(self) -> None:
        """Nothing."""

    def step_done(self, step: int) -> None:
        """Nothing."""

    def collective_started(self, *, gradient: bool = False) -> list[float] | None:
        """Nothing; returns None."""
        return None

    def collective_done(self, span: list[float] | None) -> None:
        """Nothing."""

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """The loader's items, untimed."""
        return iter(loader)

    def checkpoint(self) -> contextlib.AbstractContextManager[None]:
        """A context that times nothing."""
        return contextlib.nullcontext()

    def attach(self, model: Any) -> str | None:
        """Hooks nothing; returns None."""
        return None

    def flush(self) -> None:
        """Nothing."""

    def stalled(self, report: Any) -> None:
        """Nothing (the watchdog's ``on_stall``)."""

    def close(self) -> None:
        """Nothing."""


OFF = TelemetryOff()
"""The shared do-nothing marks (what :func:`~gpu_training.step.train_step` uses by default)."""


def _union_ms(spans: list[list[float]], lo: float, hi: float) -> float:
    """Milliseconds of ``[lo, hi]`` covered by the ``[start, end]`` spans."""
    total, reach = 0.0, lo
    for start, end, _ in sorted(spans):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total += end - start
            reach = end
    return total * 1e3


class _ResidentSet:
    """The process's resident set size, read from ``/proc/self/statm`` kept open.

    A re-read is one ``pread`` (0.7 µs) where opening the file each time costs 6.7 µs: the
    recorder reads it at every log step, and on a millisecond step that shows.
    """

    def __init__(self) -> None:
        self._fd: int | None = None
        self._page = os.sysconf("SC_PAGE_SIZE")

    def bytes(self) -> int | None:
        """Resident bytes now, or None where the file cannot be read (not Linux)."""
        try:
            if self._fd is None:
                self._fd = os.open("/proc/self/statm", os.O_RDONLY)
            return int(os.pread(self._fd, 128, 0).split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        """Closes the file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class RankTelemetry(TelemetryOff):
    """One rank's step telemetry, appended to ``<run_dir>/telemetry/rank<rank>.jsonl``.

    Args:
        run_dir: The run's output directory.
        rank: This rank (its file is its own: no other rank writes it).
        start: Facts for the ``start`` record (``world_size``, ``total_steps``, ``strategy``,
            ``device``, ``device_name``, ``checkpoint_dir``...); the pid, host and time are
            added.
        device: Where the model runs: memory is CUDA's peak allocation on a CUDA device, the
            process's resident set size otherwise.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        rank: int,
        start: Mapping[str, Any] | None = None,
        device: Any = None,
    ) -> None:
        self.path = rank_file(run_dir, rank)
        # Opened at the first write: a run refused before its first step (bad input found
        # on the ranks, e.g. a resume refused) leaves nothing on disk.
        self._file: IO[str] | None = None
        self._closed = False
        self._device = device
        self._cuda = getattr(device, "type", None) == "cuda"
        head = {"kind": "start", "rank": rank, "pid": os.getpid(), "host": socket.gethostname()}
        self._head = json.dumps({**head, **(start or {}), "started": time.time()}) + "\n"
        self._wall = time.time() - _now()  # a mark's wall time, without a clock call per step
        self._rss = _ResidentSet()
        self._done: list[tuple[Any, ...]] = []  # closed steps, as step_line's arguments
        self._spans: list[list[float]] = []  # the step's collectives: [start, end, gradient]
        self._reset()
        self._pending: int | None = None  # a step whose end is the next step's start
        self._settle: Any = None  # DDP: keeps one hook once the first backward has run

    # --- marks -------------------------------------------------------------------------

    def _reset(self) -> None:
        self._t0 = _NAN
        self._data = 0.0
        self._compute = _NAN
        self._opt0 = _NAN
        self._opt1 = _NAN
        self._ckpt = 0.0
        self._grad_call = _NAN
        self._ready = _NAN  # DDP: when backward produced this rank's last gradient
        if self._spans:
            self._spans.clear()
        self._open = False

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """The loader's items, each request timed as data wait; a request ends the last step."""
        it = iter(loader)
        while True:
            t = _now()
            if self._pending is not None:
                self._finish(t)
            if self._t0 != self._t0:  # NaN: the first request of a step starts it
                self._t0 = t
            try:
                item = next(it)
            except StopIteration:
                return
            self._data += _now() - t
            yield item

    def compute_started(self) -> None:
        """Forward and backward of the step's micro-batches begin."""
        self._compute = _now()
        self._ready = _NAN
        self._open = True

    def optimizer_started(self) -> None:
        """The optimizer step begins (compute is over)."""
        self._opt0 = _now()

    def step_done(self, step: int) -> None:
        """The optimizer step ``step`` (1 for the first) is over."""
        self._opt1 = _now()
        self._open = False
        self._pending = step
        if self._settle is not None and self._settle():
            self._settle = None

    def collective_started(self, *, gradient: bool = False) -> list[float] | None:
        """This rank arrives at a collective of the step; hand the result to :meth:`collective_done`."""
        if not self._open:  # evaluation and saves between steps are not the step's
            return None
        t = _now()
        if gradient and self._grad_call != self._grad_call:
            self._grad_call = t
        span = [t, _NAN, 1.0 if gradient else 0.0]
        self._spans.append(span)
        return span

    def collective_done(self, span: list[float] | None) -> None:
        """The collective of ``span`` completed (any thread may call this)."""
        if span is not None:
            span[1] = _now()

    def checkpoint(self) -> contextlib.AbstractContextManager[None]:
        """Times a save after the step (it counts in that step's ``checkpoint_ms``)."""
        return _Timed(self)

    # --- records ----------------------------------------------------------------------

    def _finish(self, end: float) -> None:
        """Closes the pending step at ``end`` (the next step's start, or a flush at the end)."""
        step, self._pending = self._pending, None
        t0, began = self._t0, self._compute
        if step is None or began != began:
            self._reset()
            return
        opt0 = self._opt0 if self._opt0 == self._opt0 else self._opt1
        arrival: float | None = None
        comm = 0.0
        compute = (opt0 - began) * 1e3
        if self._ready == self._ready:  # DDP: the gradients' all-reduce, until backward returned
            self._spans.append([self._ready, opt0, 1.0])
            if self._grad_call != self._grad_call:
                self._grad_call = self._ready
        if self._spans:  # a collective still in flight counts until the optimizer step
            spans = [[s, e if e == e else opt0, g] for s, e, g in self._spans]
            if self._grad_call == self._grad_call:
                waits = [sp for sp in spans if sp[2] == 0.0]
                arrival = (self._grad_call - t0) * 1e3 - _union_ms(waits, t0, self._grad_call)
            comm = _union_ms(spans, t0, end)
            compute -= _union_ms(spans, began, opt0)
        self._done.append(
            (
                step,
                (end - t0) * 1e3,
                self._data * 1e3,
                max(compute, 0.0),
                arrival,
                comm,
                (self._opt1 - opt0) * 1e3,
                self._ckpt * 1e3,
                end + self._wall,
            )
        )
        self._reset()

    def _memory(self) -> tuple[int | None, str]:
        if self._cuda:
            import torch

            return int(torch.cuda.max_memory_allocated(self._device)), "cuda_peak"
        return self._rss.bytes(), "rss"

    def flush(self) -> None:
        """Writes the steps closed since the last flush (the Trainer calls it at log steps a
        second apart, and before a checkpoint)."""
        if not self._done or self._closed:
            return
        memory, kind = self._memory()
        tail = f', "memory_bytes": {"null" if memory is None else memory}, "memory_kind": "{kind}"'
        text = "".join(step_line(*values, tail=tail) for values in self._done)
        self._done = []
        self._write_text(text)

    def note(self, kind: str, **values: Any) -> None:
        """Appends one record of ``kind`` at once (e.g. ``stall`` with the watchdog's verdict)."""
        self._write([{"kind": kind, "time": time.time(), **values}])

    def stalled(self, report: Any) -> None:
        """Records the watchdog's verdict at once (its ``on_stall``: a :class:`StallReport`),
        after the steps closed but not yet written (the process may end right after)."""
        self.flush()
        self.note(
            "stall", message=report.message, culprits=list(report.culprits), step=report.last_step
        )

    def close(self) -> None:
        """Closes the last step, writes what is left and closes the file."""
        if self._pending is not None:
            self._finish(_now())
        self.flush()
        self._rss.close()
        if self._file is not None:
            self._file.close()
            self._file = None
        self._closed = True

    def _write(self, records: list[dict[str, Any]]) -> None:
        self._write_text("".join(json.dumps(r) + "\n" for r in records))

    def _write_text(self, text: str) -> None:
        if self._closed:
            return
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
                text = self._head + text  # the start record first
            self._file.write(text)
            self._file.flush()
        except OSError:  # a full disk must not end the run: the job is what matters
            pass

    # --- the strategy's collectives -----------------------------------------------------

    def attach(self, model: Any) -> str | None:
        """Hooks the gradient collectives of a wrapped model; returns how, or None.

        DDP: a hook on the parameter whose gradient comes last in backward (learned in the
        first backward): from that moment the rank only waits for the gradient all-reduce. FSDP2: timed subclasses of its default all-gather
        and reduce-scatter on every FSDP module. Anything else (DeepSpeed, a plain model):
        nothing, and the records carry no arrival.
        """
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            self._settle = _LastGradient(self, model.module).settle
            return "ddp_last_gradient"
        try:
            from torch.distributed.fsdp import FSDPModule
        except ImportError:  # pragma: no cover - torch without FSDP2
            return None
        modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
        if not modules:
            return None
        gather, scatter = _fsdp_comms(self)
        for module in modules:
            with contextlib.suppress(ValueError):  # several param groups: left untimed
                module.set_custom_all_gather(gather)
                module.set_custom_reduce_scatter(scatter)
        return "fsdp_comms"


class _LastGradient:
    """Notes when backward produces a DDP rank's last gradient: its arrival at the gradient sync.

    DDP launches a bucket's all-reduce when the bucket's last gradient is ready; once the last
    gradient of the model is, the rank has nothing left to compute and waits for the all-reduce
    (on CPU ranks inside backward, which returns when it is done). That moment, compared across
    ranks, is what names a straggler. A communication hook would time every bucket, but runs
    Python on every bucket and a completion callback on the backend's thread: 60-85 µs of CPU a
    step on two gloo ranks of a 1.8 ms step, against about 1 µs for this one hook (measured with
    a script of 2 x 50 interleaved blocks of 200 steps). The first backward hooks every parameter
    to learn which gradient comes last (the order is the graph's: the same every step); then
    only that parameter stays hooked.
    """

    def __init__(self, tel: RankTelemetry, module: Any) -> None:
        self._tel = tel
        self._order: list[int] = []
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._handles = [
            p.register_post_accumulate_grad_hook(self._learning(i))
            for i, p in enumerate(self._params)
        ]

    def _learning(self, index: int) -> Any:
        def hook(_param: Any) -> None:
            self._order.append(index)
            self._tel._ready = _now()

        return hook

    def settle(self) -> bool:
        """After a backward: keeps the hook of the last gradient only; False before any."""
        if not self._order:
            return False
        for handle in self._handles:
            handle.remove()
        tel = self._tel

        def ready(_param: Any) -> None:
            tel._ready = _now()

        self._handles = [self._params[self._order[-1]].register_post_accumulate_grad_hook(ready)]
        return True


class _Timed:
    """Adds the time inside the ``with`` block to the step's checkpoint time."""

    def __init__(self, tel: RankTelemetry) -> None:
        self._tel = tel
        self._t = 0.0

    def __enter__(self) -> None:
        self._t = _now()

    def __exit__(self, *exc: object) -> None:
        self._tel._ckpt += _now() - self._t


def _fsdp_comms(tel: RankTelemetry) -> tuple[Any, Any]:
    """FSDP2's default all-gather and reduce-scatter, timed (torch's own classes, subclassed)."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import (  # FSDP2's defaults
        DefaultAllGather,
        DefaultReduceScatter,
    )

    def timed(work: Any, span: list[float] | None, tensor: Any) -> Any:
        if span is None:
            return work
        if work is None or tensor.device.type != "cpu":  # done when called (CUDA: enqueued)
            tel.collective_done(span)
        else:
            work.get_future().then(lambda _: tel.collective_done(span))
        return work

    class TimedAllGather(DefaultAllGather):
        def __call__(
            self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False
        ) -> Any:
            span = tel.collective_started()
            work = super().__call__(output_tensor, input_tensor, group, async_op)
            return timed(work, span, output_tensor)

    class TimedReduceScatter(DefaultReduceScatter):
        def __call__(
            self, output_tensor: Any, input_tensor: Any, group: Any, op: Any, async_op: bool = False
        ) -> Any:
            span = tel.collective_started(gradient=True)
            work = super().__call__(output_tensor, input_tensor, group, op, async_op)
            return timed(work, span, output_tensor)

    return TimedAllGather(), TimedReduceScatter()


def open_telemetry(
    job: JobConfig, ctx: DistributedContext, device: Any, total: int, *, model: Any = None
) -> TelemetryOff:
    """This rank's telemetry for a Trainer run of ``job`` (:data:`OFF` with ``run.telemetry`` off).

    ``model``, the wrapped model, gets its collectives hooked (:meth:`RankTelemetry.attach`)
    before its first forward.

    The ``start`` record carries what ``gpu-training watch`` needs besides the steps: the world
    size, the run's total steps, the strategy, the device and its name (for the price and the
    peak), the checkpoint directory and the log cadence.
    """
    if not job.run.telemetry:
        return OFF
    name = "cpu"
    if getattr(device, "type", None) == "cuda":
        import torch

        name = torch.cuda.get_device_name(device)
    start = {
        "world_size": ctx.world_size,
        "total_steps": total,
        "strategy": job.strategy.name,
        "device": str(device),
        "device_name": name,
        "checkpoint_dir": str(Path(job.checkpoint_dir).resolve()),
        "log_every": job.run.log_every,
    }
    telemetry = RankTelemetry(job.run.output_dir, rank=ctx.rank, start=start, device=device)
    if model is not None:
        telemetry.attach(model)
    return telemetry
