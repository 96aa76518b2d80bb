"""GPU tier: skipped on CPU machines, run by `make test-gpu` where CUDA exists."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpu_training.amp import MixedPrecisionTrainer, resolve_precision
from gpu_training.ddp import DistributedContext, resolve_device


@pytest.mark.requires_cuda
def test_auto_precision_and_device_on_cuda() -> None:
    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    assert resolve_precision("auto", "cuda") == expected
    assert resolve_device(DistributedContext()) == torch.device("cuda", 0)


@pytest.mark.requires_cuda
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_step_on_cuda_tracks_fp32(precision: str) -> None:
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("GPU without bf16")
    torch.manual_seed(0)
    x, y = torch.randn(64, 32, device="cuda"), torch.randn(64, 8, device="cuda")
    norms = {}
    for p in ("fp32", precision):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).cuda()
        trainer = MixedPrecisionTrainer(
            torch.optim.SGD(model.parameters(), lr=0.1), precision=p, max_grad_norm=1.0
        )
        with trainer.autocast():
            loss = nn.functional.mse_loss(model(x).float(), y)
        trainer.backward(loss)
        norms[p] = trainer.step(model.parameters(), 0)
    assert norms[precision] == pytest.approx(norms["fp32"], rel=2e-2)
