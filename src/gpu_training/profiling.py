"""Size a job to the hardware: the guides' module for the batch finder, throughput and traces.

- :func:`find_max_batch_size` / :func:`make_fits`: the largest batch that really fits
  (defined in :mod:`gpu_training.batch_finder`);
- :class:`ThroughputMeter`, :func:`flops_per_token`, :func:`peak_tflops`: samples/s,
  tokens/s and model FLOPs utilisation against a datasheet peak table (defined in
  :mod:`gpu_training.throughput`);
- :func:`profile_steps`: a ``torch.profiler`` trace of N steps (defined in
  :mod:`gpu_training.traces`).

Example:
    >>> from gpu_training.profiling import find_max_batch_size
    >>> find_max_batch_size(lambda batch: batch <= 100, max_batch=1024, safety_margin=0.85)
    85
"""

from __future__ import annotations

from gpu_training.batch_finder import (
    BatchSearchResult,
    BatchSizeError,
    find_max_batch_size,
    is_out_of_memory,
    make_fits,
    margin_ceiling,
    per_device_batch_for_share,
    release_cached_memory,
    search_max_batch_size,
)
from gpu_training.throughput import (
    PEAK_TFLOPS,
    ThroughputMeter,
    ThroughputStats,
    flops_per_token,
    peak_tflops,
)
from gpu_training.traces import ProfileResult, profile_steps

__all__ = [
    "PEAK_TFLOPS",
    "BatchSearchResult",
    "BatchSizeError",
    "ProfileResult",
    "ThroughputMeter",
    "ThroughputStats",
    "find_max_batch_size",
    "flops_per_token",
    "is_out_of_memory",
    "make_fits",
    "margin_ceiling",
    "peak_tflops",
    "per_device_batch_for_share",
    "profile_steps",
    "release_cached_memory",
    "search_max_batch_size",
]
