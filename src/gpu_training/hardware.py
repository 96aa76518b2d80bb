"""The GPUs a plan prices: dense bf16 peaks, memory, link bandwidths and prices per GPU-hour.

:data:`GPU_TYPES` is the table ``gpu-training plan --gpu-type`` reads; :func:`gpu_spec` looks
a type up (with a suggestion for a typo), :func:`load_hardware` reads a YAML/JSON file that
starts from a table entry (``gpu_type: h100``) or describes a GPU of its own, and
:meth:`GPUSpec.replace` applies command-line overrides. :mod:`gpu_training.cost` turns a
:class:`GPUSpec` into step times, hours and dollars. No torch here.

Bandwidths are GB/s (10⁹ bytes per second) per GPU and per direction, which is what a ring
collective is limited by: the datasheets' NVLink and PCIe figures count both directions and
are halved here. They are peak link rates; NCCL reaches less (its ``busbw`` in nccl-tests),
so override them with what you measured.

Example:
    >>> spec = gpu_spec("h100")
    >>> spec.bf16_tflops, spec.intra_node_gbps, spec.price_per_gpu_hour
    (989.4, 450.0, 2.49)
    >>> spec.replace(price_per_gpu_hour=2.0).price_per_gpu_hour
    2.0
    >>> gpu_spec("h10")
    Traceback (most recent call last):
    ...
    gpu_training.hardware.HardwareError: unknown GPU type 'h10' (did you mean 'h100'?); ...
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_MFU",
    "GPU_TYPES",
    "MFU_SOURCE",
    "GPUSpec",
    "HardwareError",
    "gpu_spec",
    "load_hardware",
]

DEFAULT_MFU = 0.40
"""Model FLOPs utilisation a plan assumes unless told: the share of the dense peak that a
well-tuned PyTorch step sustains on a transformer."""

MFU_SOURCE = (
    "between torchtitan's 33-39% for Llama 3.1 8B with FSDP on 8 H100 "
    "(pytorch/torchtitan docs/performance.md) and PaLM's 46.2% (arXiv:2204.02311)"
)

_GUIDE_PRICES = (
    "the multi-GPU guide (GPUBrazil): 4x RTX 4090 $1.60/h, 8x A100 80GB $9.60/h, 8x H100 $19.92/h"
)

# Bounds that only a typo crosses: they keep the arithmetic finite.
_MAX_TFLOPS = 1e5  # 100 PFLOP/s per GPU; an H100 does about 1
_MAX_GBPS = 1e5  # 100 TB/s per GPU; NVLink 5 is 1.8 TB/s both ways
_MAX_MEMORY_GIB = 2.0**20  # 1 PiB, the bound of --gpu-memory
_MAX_PRICE = 1e4  # dollars per GPU-hour


class HardwareError(ValueError):
    """A GPU type, hardware file or hardware figure that cannot be used: one line naming it."""


@dataclass(frozen=True)
class GPUSpec:
    """One GPU as the time-and-cost model sees it.

    Example:
        >>> GPUSpec("my GPU", bf16_tflops=100, memory_gib=24, intra_node_gbps=32,
        ...         inter_node_gbps=3, pcie_gbps=32).price_per_gpu_hour is None
        True
    """

    name: str
    """What the plan prints, e.g. ``H100 SXM 80GB``."""
    bf16_tflops: float
    """Dense bf16 tensor-core peak, TFLOP/s (the datasheets' "with sparsity" figure halved)."""
    memory_gib: float
    """Memory per GPU, GiB."""
    intra_node_gbps: float
    """GB/s per GPU per direction to the other GPUs of its node (NVLink, else PCIe)."""
    inter_node_gbps: float
    """GB/s per GPU per direction to other nodes: its NIC, or its share of the node's."""
    pcie_gbps: float
    """GB/s per GPU per direction to host memory: what CPU offload moves over."""
    price_per_gpu_hour: float | None = None
    """Dollars per GPU-hour (None: unknown, so no cost is printed)."""
    mfu: float = DEFAULT_MFU
    """Model FLOPs utilisation to assume on this GPU (see :data:`DEFAULT_MFU`)."""
    source: str = ""
    """Where the figures come from."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise HardwareError(f"name must be a non-empty string, got {self.name!r}")
        bounds = {
            "bf16_tflops": _MAX_TFLOPS,
            "memory_gib": _MAX_MEMORY_GIB,
            "intra_node_gbps": _MAX_GBPS,
            "inter_node_gbps": _MAX_GBPS,
            "pcie_gbps": _MAX_GBPS,
            "price_per_gpu_hour": _MAX_PRICE,
            "mfu": 1.0,
        }
        for field, top in bounds.items():
            value = getattr(self, field)
            if value is None and field == "price_per_gpu_hour":
                continue
            _check_number(field, value, top)

    def replace(self, **changes: Any) -> GPUSpec:
        """A copy with the fields in ``changes`` that are not None replaced (and re-checked).

        Raises:
            HardwareError: For an unknown field or a value out of range.
        """
        known = {f.name for f in dataclasses.fields(self)}
        for key in changes:
            if key not in known:
                raise HardwareError(f"unknown hardware field {key!r}{_suggest(key, known)}")
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain mapping (for JSON)."""
        return dataclasses.asdict(self)


def _check_number(field: str, value: object, top: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and 0 < value <= top)
    ):
        raise HardwareError(f"{field}: expected a finite number > 0 and <= {top:g}, got {value!r}")


def _suggest(value: str, choices: Any) -> str:
    close = difflib.get_close_matches(value, sorted(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


_NVIDIA_H100 = "NVIDIA H100 datasheet (SXM5: bf16 1,979 TFLOPS with sparsity, NVLink 900 GB/s, PCIe Gen5 128 GB/s)"
_NVIDIA_A100 = "NVIDIA A100 datasheet (bf16 312 TFLOPS dense, NVLink 600 GB/s, PCIe Gen4 64 GB/s)"

GPU_TYPES: dict[str, GPUSpec] = {
    "h100": GPUSpec(
        "H100 SXM 80GB",
        bf16_tflops=989.4,
        memory_gib=80,
        intra_node_gbps=450.0,  # NVLink 4: 900 GB/s both ways
        inter_node_gbps=50.0,  # 400 Gb/s per GPU, the RDMA network of torchtitan's H100 hosts
        pcie_gbps=64.0,  # PCIe Gen5 x16: 128 GB/s both ways
        price_per_gpu_hour=2.49,  # 8x H100 at $19.92/h
        source=f"{_NVIDIA_H100}; 400 Gb/s per GPU: torchtitan docs/performance.md; price: {_GUIDE_PRICES}",
    ),
    "h200": GPUSpec(
        "H200 SXM 141GB",
        bf16_tflops=989.4,  # the H100 SXM's compute with more and faster memory
        memory_gib=141,
        intra_node_gbps=450.0,
        inter_node_gbps=50.0,
        pcie_gbps=64.0,
        source="NVIDIA H200 datasheet (141 GB HBM3e, bf16 1,979 TFLOPS with sparsity, NVLink 900 GB/s); no guide price",
    ),
    "a100-80gb": GPUSpec(
        "A100 SXM 80GB",
        bf16_tflops=312.0,
        memory_gib=80,
        intra_node_gbps=300.0,  # NVLink 3: 600 GB/s both ways
        inter_node_gbps=25.0,  # 200 Gb/s per GPU, as on the clusters that trained Llama 2
        pcie_gbps=32.0,  # PCIe Gen4 x16: 64 GB/s both ways
        price_per_gpu_hour=1.20,  # 8x A100 80GB at $9.60/h
        source=f"{_NVIDIA_A100}; 200 Gbps end-points: Llama 2 paper (arXiv:2307.09288) section 2.2.1; price: {_GUIDE_PRICES}",
    ),
    "a100-40gb": GPUSpec(
        "A100 SXM 40GB",
        bf16_tflops=312.0,
        memory_gib=40,
        intra_node_gbps=300.0,
        inter_node_gbps=25.0,
        pcie_gbps=32.0,
        source=f"{_NVIDIA_A100}; no guide price",
    ),
    "l40s": GPUSpec(
        "L40S 48GB",
        bf16_tflops=362.05,
        memory_gib=48,
        intra_node_gbps=32.0,  # no NVLink: GPU to GPU over PCIe Gen4 x16
        inter_node_gbps=1.5625,  # the guide's 100 Gb/s floor for multi-node, shared by 8 GPUs
        pcie_gbps=32.0,
        source="NVIDIA L40S datasheet (bf16 362.05 TFLOPS dense, PCIe Gen4 x16 64 GB/s both ways, no NVLink); 100 Gbps: the distributed-training guide's multi-node floor; no guide price",
    ),
    "rtx4090": GPUSpec(
        "GeForce RTX 4090 24GB",
        bf16_tflops=165.2,  # bf16 with fp32 accumulate, as PyTorch runs it (GeForce: half rate)
        memory_gib=24,
        intra_node_gbps=32.0,  # PCIe Gen4 x16, no NVLink and no P2P: NCCL reaches less
        inter_node_gbps=3.125,  # the guide's 100 Gb/s floor for multi-node, shared by 4 GPUs
        pcie_gbps=32.0,
        price_per_gpu_hour=0.40,  # 4x RTX 4090 at $1.60/h
        source=f"NVIDIA Ada Lovelace architecture whitepaper (RTX 4090: bf16 tensor 165.2 TFLOPS dense with fp32 accumulate); 100 Gbps: the distributed-training guide's multi-node floor; price: {_GUIDE_PRICES}",
    ),
}
"""GPU types by the name ``--gpu-type`` takes. Prices are the guide's machine prices divided by
their GPUs; types the guide does not price have none (give ``--price-per-gpu-hour``)."""


def gpu_spec(gpu_type: str) -> GPUSpec:
    """The table entry for ``gpu_type`` (``h100``, ``a100-80gb``, ``rtx4090``...).

    Raises:
        HardwareError: For a name not in :data:`GPU_TYPES`, with the closest one.
    """
    key = gpu_type.strip().lower() if isinstance(gpu_type, str) else gpu_type
    if key not in GPU_TYPES:
        raise HardwareError(
            f"unknown GPU type {gpu_type!r}{_suggest(str(key), GPU_TYPES)}; "
            f"expected one of {', '.join(GPU_TYPES)}"
        )
    return GPU_TYPES[key]


def load_hardware(path: str | os.PathLike[str], gpu_type: str | None = None) -> GPUSpec:
    """A :class:`GPUSpec` from a YAML or JSON file of :class:`GPUSpec` fields.

    The file either starts from a table entry (``gpu_type: h100``, then any fields to change)
    or names every figure itself (``name``, ``bf16_tflops``, ``memory_gib``,
    ``intra_node_gbps``, ``inter_node_gbps``, ``pcie_gbps``; ``price_per_gpu_hour`` and
    ``mfu`` optional)::

        gpu_type: a100-80gb
        price_per_gpu_hour: 1.79
        inter_node_gbps: 12.5

    Args:
        path: The file (``.json`` is read as JSON, anything else as YAML).
        gpu_type: A table entry to start from instead of the file's ``gpu_type``.

    Returns:
        The GPU, checked.

    Raises:
        HardwareError: For a missing or unparsable file, an unknown field or GPU type, a
            missing figure or one out of range; the message names the file and the field.
    """
    from gpu_training.config import ConfigError, read_config_file

    try:
        data = read_config_file(path)
    except ConfigError as err:
        raise HardwareError(str(err)) from None
    where = str(Path(path))
    base_name = gpu_type if gpu_type is not None else data.pop("gpu_type", None)
    data.pop("gpu_type", None)
    known = {f.name for f in dataclasses.fields(GPUSpec)}
    for key in data:
        if key not in known:
            raise HardwareError(
                f"{where}: unknown field {key!r}{_suggest(str(key), known | {'gpu_type'})}; "
                f"expected gpu_type or {', '.join(sorted(known))}"
            )
    try:
        if base_name is not None:
            if not isinstance(base_name, str):
                raise HardwareError(f"gpu_type: expected a GPU type name, got {base_name!r}")
            base = gpu_spec(base_name)
            return base.replace(source=f"{where} over {base_name}: {base.source}", **data)
        missing = [
            f.name
            for f in dataclasses.fields(GPUSpec)
            if f.default is dataclasses.MISSING and f.name not in data
        ]
        if missing:
            raise HardwareError(
                f"missing {', '.join(missing)} (or give gpu_type: one of {', '.join(GPU_TYPES)})"
            )
        return GPUSpec(**{"source": where, **data})
    except HardwareError as err:
        raise HardwareError(f"{where}: {err}") from None
