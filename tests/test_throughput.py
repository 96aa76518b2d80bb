"""ThroughputMeter, the MFU formula and the peak table (gpu_training.profiling).

Timing is driven by a fake clock, so every rate is exact; the FLOPs formula is checked against
the built-in transformer's own count and the reference shape's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from gpu_training.memory import TransformerShape
from gpu_training.profiling import (
    PEAK_TFLOPS,
    ThroughputMeter,
    flops_per_token,
    peak_tflops,
)
from gpu_training.tasks.charlm import CharLMConfig, CharTransformer


class Clock:
    def __init__(self, *ticks: float) -> None:
        self._ticks: Iterator[float] = iter(ticks)

    def __call__(self) -> float:
        return next(self._ticks)


def test_formula_matches_the_models_own_counts() -> None:
    model = CharTransformer(CharLMConfig(block_size=64, n_layer=3, n_head=4, n_embd=64), 72)
    expected = flops_per_token(model.num_parameters(), 3, 4, 16, 64)
    assert expected == model.flops_per_token()
    shape = TransformerShape(num_layers=12, hidden_size=768, seq_len=1024)
    n = shape.num_params() - 1024 * 768  # position embeddings are lookups, not matmuls
    assert shape.flops_per_token() == flops_per_token(n, 12, 12, 64, 1024)
    assert flops_per_token(10) == 60  # no attention: 6 N
    with pytest.raises(ValueError, match="num_layers must be an integer >= 0"):
        flops_per_token(10, num_layers=-1)


def test_rates_tflops_and_mfu_over_a_window() -> None:
    fpt = flops_per_token(124_000_000, 12, 12, 64, 1024)
    meter = ThroughputMeter(
        flops_per_token=fpt, peak_tflops=989.4, world_size=8, device="cpu", clock=Clock(10, 12.5)
    )
    for _ in range(5):
        meter.update(samples=16, tokens=16 * 1024)
    stats = meter.compute()
    assert (stats.steps, stats.samples, stats.tokens, stats.elapsed_s) == (5, 80, 81920, 2.5)
    assert stats.samples_per_s == 32.0 and stats.tokens_per_s == 32768.0
    achieved = 32768.0 * fpt / 1e12
    assert stats.tflops == pytest.approx(achieved)
    assert stats.mfu == pytest.approx(achieved / 989.4)
    metrics = stats.to_metrics()
    assert metrics["global_samples_per_s"] == 8 * 32.0 and metrics["mfu"] == stats.mfu
    text = str(stats)
    assert "32.0 samples/s" in text and "32,768 tokens/s" in text and "MFU 2.8%" in text


def test_windows_reset_and_start_drops_warmup() -> None:
    meter = ThroughputMeter(device="cpu", clock=Clock(0, 1, 3, 4))
    meter.update(samples=100)  # warm-up step: dropped by start()
    meter.start()  # t = 1
    meter.update(samples=10)
    first = meter.compute()  # t = 3
    meter.update(samples=10)
    second = meter.compute()  # t = 4
    assert (first.samples, first.elapsed_s, first.samples_per_s) == (10, 2, 5.0)
    assert (second.samples, second.elapsed_s, second.samples_per_s) == (10, 1, 10.0)
    assert first.tflops is None and first.mfu is None and second.tokens_per_s == 0.0
    assert "MFU n/a" in str(first) and "tokens/s" not in str(first)
    assert set(first.to_metrics()) == {
        "samples_per_s",
        "tokens_per_s",
        "global_samples_per_s",
        "global_tokens_per_s",
    }


@pytest.mark.parametrize(
    ("name", "precision", "peak"),
    [
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100 80GB PCIe", "fp32", 19.5),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "fp16", 756.0),
        ("NVIDIA H100 NVL", "bf16", 835.5),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA H200 NVL", "tf32", 417.5),
        ("NVIDIA B200", "bf16", 2250.0),
        ("NVIDIA L40S", "bf16", 362.05),
        ("NVIDIA A10G", "bf16", 70.0),
        ("NVIDIA A10", "tf32", 62.5),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
        ("AMD Instinct MI300X", "bf16", 1307.4),
        ("Tesla V100-SXM2-32GB", "fp16", None),
        ("NVIDIA GeForce RTX 3090", "bf16", None),
    ],
)
def test_peak_table(name: str, precision: str, peak: float | None) -> None:
    assert peak_tflops(name, precision) == peak


def test_peak_lookup_on_this_machine_and_override() -> None:
    if not torch.cuda.is_available():
        assert peak_tflops() is None and peak_tflops("cpu") is None
    meter = ThroughputMeter(flops_per_token=1e9, peak_tflops=100.0, device="cpu", clock=Clock(0, 1))
    meter.update(samples=1, tokens=50_000)
    assert meter.compute().mfu == pytest.approx(0.5)  # 50e3 tokens/s x 1e9 / 100e12
    assert ThroughputMeter(device="cpu").peak_tflops is None  # the CPU has no table entry
    assert all(set(p) == {"fp32", "tf32", "bf16", "fp16"} for p in PEAK_TFLOPS.values())
    with pytest.raises(ValueError, match="precision"):
        peak_tflops("NVIDIA H100", "fp8")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"flops_per_token": 0}, "flops_per_token must be > 0"),
        ({"peak_tflops": -1.0}, "peak_tflops must be > 0"),
        ({"world_size": 0}, "world_size must be a positive integer"),
    ],
)
def test_bad_arguments(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ThroughputMeter(device="cpu", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="counts must be >= 0"):
        ThroughputMeter(device="cpu").update(samples=-1)


def test_a_real_cpu_loop_reports_consistent_numbers() -> None:
    model = CharTransformer(CharLMConfig(block_size=32, n_layer=1, n_head=2, n_embd=32), 16)
    meter = ThroughputMeter(flops_per_token=model.flops_per_token(), peak_tflops=1.0, device="cpu")
    x = torch.randint(16, (8, 32))
    for _ in range(3):
        model(x).sum().backward()
        meter.update(samples=8, tokens=8 * 32)
    stats = meter.compute()
    assert stats.samples == 24 and stats.elapsed_s > 0
    assert math.isclose(stats.tokens_per_s, 32 * stats.samples_per_s)
    assert stats.mfu is not None and 0 < stats.mfu < 1


def test_an_unknown_gpu_gets_no_mfu_and_one_line_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_training import throughput

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-32GB")
    monkeypatch.setattr(throughput, "peak_tflops", lambda device=None, precision="bf16": None)
    note = throughput.mfu_note(cuda, "bf16", None, 1e9)
    assert note == (
        "MFU: no peak known for 'Tesla V100-SXM2-32GB' (not in PEAK_TFLOPS); "
        "set run.peak_tflops to see it"
    )
    assert throughput.mfu_note(cuda, "bf16", 125.0, 1e9) is None  # run.peak_tflops given
    assert throughput.mfu_note(cuda, "bf16", None, None) is None  # no FLOPs: no MFU to miss
    monkeypatch.setattr(throughput, "peak_tflops", lambda device=None, precision="bf16": 989.4)
    assert throughput.mfu_note(cuda, "bf16", None, 1e9) is None  # in the table
