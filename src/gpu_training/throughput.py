"""How fast a training loop runs: samples/s, tokens/s and model FLOPs utilisation (MFU).

:class:`ThroughputMeter` counts samples and tokens per step without a device sync and turns
a window of steps into a :class:`ThroughputStats` (per rank and job-wide rates, TFLOP/s per
GPU, MFU). MFU is achieved model FLOP/s over the GPU's peak: :func:`flops_per_token` gives
the model's training FLOPs per token (``6·N + 12·L·H·Q·T``) and :func:`peak_tflops` looks
the peak up in :data:`PEAK_TFLOPS` (dense; B200, H200, H100, A100, L40S, A10G, A10, RTX 4090,
MI300X). The batch-size finder lives in
:mod:`gpu_training.profiling`, which re-exports everything here.

Example:
    >>> from gpu_training.throughput import flops_per_token, peak_tflops
    >>> fpt = flops_per_token(124_000_000, num_layers=12, num_heads=12, head_dim=64, seq_len=1024)
    >>> round(100_000 * fpt / 1e12 / peak_tflops("NVIDIA A100-SXM4-80GB"), 3)  # 100k tokens/s
    0.275
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gpu_training.config.checks import check_int_argument, check_positive_int_argument

__all__ = [
    "PEAK_TFLOPS",
    "ThroughputMeter",
    "ThroughputStats",
    "flops_per_token",
    "mfu_note",
    "peak_tflops",
]


# --- FLOPs and peaks -----------------------------------------------------------------------

PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # Dense tensor-core peaks (fp32: the non-tensor rate) from the vendors' datasheets, the
    # "with sparsity" figures halved. Each row names its source.
    # NVIDIA B200 (HGX B200 datasheet, 8 GPUs: 36 PF bf16 / 18 PF tf32 sparse, 600 TF fp32).
    "B200": {"fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0},
    # NVIDIA H200 / H100 datasheets (SXM; NVL and PCIe boards are slower and come first).
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H200": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
    "H100": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},  # SXM5 (HBM3)
    # NVIDIA A100 datasheet (SXM4 and PCIe); before "A10", which it contains.
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    # NVIDIA L40S datasheet (362.05 | 733 TF bf16, 183 | 366 TF tf32, 91.6 TF fp32).
    "L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05},
    # AWS's A10G (g5 instances): NVIDIA publishes no datasheet; 70 TF bf16 dense and 35 TF
    # fp32 as third-party comparisons give them (Baseten, "A10 vs A10G"), tf32 at half the
    # bf16 rate as on every Ampere part: approximate, and below the A10's tensor rates.
    "A10G": {"fp32": 35.0, "tf32": 35.0, "bf16": 70.0, "fp16": 70.0},
    # NVIDIA A10 datasheet (125 | 250 TF bf16, 62.5 | 125 TF tf32, 31.2 TF fp32).
    "A10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
    # NVIDIA Ada Lovelace whitepaper, GeForce RTX 4090 (fp16/bf16 with fp32 accumulate).
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
    # AMD Instinct MI300X datasheet (ROCm names it "AMD Instinct MI300X").
    "MI300X": {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4},
}
"""Peak dense TFLOP/s per GPU by device-name fragment and precision; the first fragment found
in ``torch.cuda.get_device_name()`` wins (so the NVL and PCIe variants come first). A GPU not
here gets no MFU rather than a guessed peak (a default peak has reported 88% for a true 12%):
give ``run.peak_tflops`` / ``--peak-tflops``."""


def flops_per_token(
    num_params: int,
    num_layers: int = 0,
    num_heads: int = 0,
    head_dim: int = 0,
    seq_len: int = 0,
) -> int:
    """Training FLOPs per token: ``6·N + 12·L·H·Q·T`` (PaLM, appendix B; nanoGPT).

    ``N`` weights cost 2 FLOPs per token forward (multiply + add) and 4 backward; attention's
    ``QKᵀ`` and ``AV`` add ``2·2·T·H·Q`` per layer forward, ×3 with the backward. ``N`` should
    leave out pure lookups (position embeddings); a causal mask is not discounted.

    Args:
        num_params: ``N``, the parameters a token is multiplied by.
        num_layers: ``L`` (0 for a model without attention).
        num_heads: ``H``.
        head_dim: ``Q`` = hidden size / heads.
        seq_len: ``T``.

    Returns:
        FLOPs per trained token.

    Example:
        >>> flops_per_token(124_000_000, num_layers=12, num_heads=12, head_dim=64, seq_len=1024)
        857246208
    """
    for name, value in (
        ("num_params", num_params),
        ("num_layers", num_layers),
        ("num_heads", num_heads),
        ("head_dim", head_dim),
        ("seq_len", seq_len),
    ):
        check_int_argument(name, value, 0)
    return 6 * num_params + 12 * num_layers * num_heads * head_dim * seq_len


def peak_tflops(device: str | torch.device | None = None, precision: str = "bf16") -> float | None:
    """Peak dense TFLOP/s of a GPU at a precision, from :data:`PEAK_TFLOPS`.

    Args:
        device: A CUDA device, or a device *name* such as ``"NVIDIA H100 80GB HBM3"``
            (default: the current CUDA device).
        precision: ``bf16``, ``fp16``, ``tf32`` or ``fp32``.

    Returns:
        TFLOP/s, or None for the CPU and GPUs not in the table (pass a peak yourself).

    Example:
        >>> peak_tflops("NVIDIA H100 80GB HBM3", "bf16"), peak_tflops("NVIDIA A100-SXM4-80GB")
        (989.4, 312.0)
        >>> peak_tflops("NVIDIA H100 PCIe"), peak_tflops("Tesla T4") is None
        (756.0, True)
    """
    if precision not in ("bf16", "fp16", "tf32", "fp32"):
        raise ValueError(f"precision must be bf16, fp16, tf32 or fp32, got {precision!r}")
    if isinstance(device, str) and not device.startswith(("cuda", "cpu", "mps", "meta")):
        name = device
    else:
        dev = torch.device(device) if device is not None else None
        if (dev is not None and dev.type != "cuda") or not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name(dev)
    for fragment, peaks in PEAK_TFLOPS.items():
        if fragment in name:
            return peaks[precision]
    return None


def mfu_note(
    device: torch.device, precision: str, peak: float | None, flops_per_token: float | None
) -> str | None:
    """The one line a run prints at its start when its GPU's MFU cannot be known, else None.

    Example:
        >>> mfu_note(torch.device("cpu"), "bf16", None, 1e9) is None  # no MFU on a CPU, said
        True
    """
    if device.type != "cuda" or peak is not None or not flops_per_token:
        return None
    if peak_tflops(device, precision) is not None:
        return None
    return (
        f"MFU: no peak known for {torch.cuda.get_device_name(device)!r} (not in PEAK_TFLOPS); "
        "set run.peak_tflops to see it"
    )


_table_peak = peak_tflops  # ThroughputMeter's argument of the same name shadows it


# --- the meter -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ThroughputStats:
    """Rates over one window of :class:`ThroughputMeter`."""

    elapsed_s: float
    steps: int
    samples: int
    tokens: int
    world_size: int
    flops_per_token: float | None
    peak_tflops: float | None

    @property
    def samples_per_s(self) -> float:
        """This rank's samples per second."""
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """This rank's tokens per second."""
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def tflops(self) -> float | None:
        """Achieved model TFLOP/s per GPU (None without ``flops_per_token``)."""
        if self.flops_per_token is None:
            return None
        return self.tokens_per_s * self.flops_per_token / 1e12

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: achieved / peak, in [0, 1] (None without a peak)."""
        achieved = self.tflops
        if achieved is None or not self.peak_tflops:
            return None
        return achieved / self.peak_tflops

    def to_metrics(self) -> dict[str, float]:
        """Flat metrics for a log line: per rank and, with ``world_size`` ranks, job-wide."""
        out = {
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "global_samples_per_s": self.samples_per_s * self.world_size,
            "global_tokens_per_s": self.tokens_per_s * self.world_size,
        }
        if self.tflops is not None:
            out["tflops_per_gpu"] = self.tflops
        if self.mfu is not None:
            out["mfu"] = self.mfu
        return out

    def __str__(self) -> str:
        parts = [f"{self.samples_per_s:,.1f} samples/s"]
        if self.tokens:
            parts.append(f"{self.tokens_per_s:,.0f} tokens/s")
        if self.tflops is not None:
            parts.append(f"{self.tflops:.2f} TFLOP/s per GPU")
        mfu = self.mfu
        parts.append(f"MFU {mfu:.1%}" if mfu is not None else "MFU n/a (unknown peak)")
        return " | ".join(parts)


class ThroughputMeter:
    """Samples/s, tokens/s and MFU of a training loop, per window between :meth:`compute` calls.

    :meth:`update` only adds counts (no device sync, call it every step);
    :meth:`compute` synchronises CUDA once, divides by the wall time since the window began,
    and starts the next window. Counts are this rank's; with ``world_size`` the job-wide rates
    assume balanced ranks (no collective is issued).

    MFU = tokens/s × ``flops_per_token`` / peak FLOP/s, with ``flops_per_token`` from
    :func:`flops_per_token` (``6·N + 12·L·H·Q·T``) and the peak from :func:`peak_tflops` for
    ``device`` and ``precision`` unless ``peak_tflops`` is given.

    Args:
        flops_per_token: Training FLOPs per token (None: no TFLOP/s or MFU).
        peak_tflops: This GPU's peak, overriding the table (e.g. a throttled or unlisted GPU).
        world_size: Ranks in the job.
        device: Training device (for the CUDA sync and the peak lookup).
        precision: ``bf16``, ``fp16``, ``tf32`` or ``fp32``, for the peak lookup.
        clock: Seconds since an arbitrary origin (tests pass a fake one).

    Example:
        >>> ticks = iter([0.0, 2.0])
        >>> meter = ThroughputMeter(flops_per_token=6e6, peak_tflops=1.0, device="cpu",
        ...                         clock=lambda: next(ticks))
        >>> for _ in range(4):
        ...     meter.update(samples=8, tokens=8 * 128)
        >>> stats = meter.compute()
        >>> stats.samples_per_s, stats.tokens_per_s, round(stats.mfu, 4)
        (16.0, 2048.0, 0.0123)
    """

    def __init__(
        self,
        *,
        flops_per_token: float | None = None,
        peak_tflops: float | None = None,
        world_size: int = 1,
        device: str | torch.device | None = None,
        precision: str = "bf16",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if flops_per_token is not None and not flops_per_token > 0:
            raise ValueError(f"flops_per_token must be > 0, got {flops_per_token!r}")
        if peak_tflops is not None and not peak_tflops > 0:
            raise ValueError(f"peak_tflops must be > 0, got {peak_tflops!r}")
        check_positive_int_argument("world_size", world_size)
        self.device = (
            torch.device(device)
            if device is not None
            else (
                torch.device("cuda", torch.cuda.current_device())
                if torch.cuda.is_available()
                else torch.device("cpu")
            )
        )
        self.flops_per_token = flops_per_token
        if precision == "fp32" and torch.get_float32_matmul_precision() != "highest":
            precision = "tf32"  # fp32 matmuls run on tensor cores as TF32 when allowed
        table = _table_peak(self.device, precision)
        self.peak_tflops = peak_tflops if peak_tflops is not None else table
        self.world_size = world_size
        self._clock = clock
        self._steps = self._samples = self._tokens = 0
        self._start = self._now()

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the queued kernels are part of the window
        return self._clock()

    def start(self) -> None:
        """Begin a new window now, dropping counts so far (e.g. after warm-up steps)."""
        self._steps = self._samples = self._tokens = 0
        self._start = self._now()

    def update(self, samples: int, tokens: int | None = None) -> None:
        """Count one step of ``samples`` samples (and ``tokens`` tokens)."""
        if samples < 0 or (tokens is not None and tokens < 0):
            raise ValueError(f"counts must be >= 0, got samples={samples}, tokens={tokens}")
        self._steps += 1
        self._samples += samples
        self._tokens += tokens or 0

    def compute(self) -> ThroughputStats:
        """Rates over the window since the last :meth:`compute` (or :meth:`start`), then reset."""
        now = self._now()
        stats = ThroughputStats(
            elapsed_s=now - self._start,
            steps=self._steps,
            samples=self._samples,
            tokens=self._tokens,
            world_size=self.world_size,
            flops_per_token=self.flops_per_token,
            peak_tflops=self.peak_tflops,
        )
        self._steps = self._samples = self._tokens = 0
        self._start = now
        return stats
