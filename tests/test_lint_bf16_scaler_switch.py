"""``gpu-training lint`` GT011: a ``GradScaler`` switched on by the bf16 setting itself.

``GradScaler(enabled=(dtype == "bfloat16"))`` (issue 33, set 19) runs the scaler exactly in the
bf16 runs, which need no loss scaling, whatever dtype the autocast later reads from a config.
The minimal reproduction is a trainer class of a DDP script; the variants write the switch
otherwise (``args.bf16``, membership in bf16 spellings, a name bound to the test, a
conjunction) in Accelerate-, FSDP- and Fabric-style scripts. The right switch (``== "float16"``)
and the negated ones stay silent.
"""

from __future__ import annotations

import pytest

from gpu_training.diagnostics.lint.report import lint_source

_DDP_TRAINER = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, cfg, model):
        self.cfg = cfg
        dist.init_process_group("nccl")
        self.model = DDP(model.cuda())
        self.dtype = {{"bfloat16": torch.bfloat16, "float16": torch.float16}}[cfg.dtype]
        self.scaler = torch.cuda.amp.GradScaler(enabled={switch})

    def step(self, batch, optimizer):
        with torch.autocast(device_type="cuda", dtype=self.dtype):
            loss = self.model(batch).mean()
        self.scaler.scale(loss).backward()
        self.scaler.step(optimizer)
        self.scaler.update()
"""


def _gt011(source: str) -> list[int]:
    return [f.line for f in lint_source(source) if f.code == "GT011"]


@pytest.mark.parametrize(
    "switch",
    [
        '(self.cfg.dtype == "bfloat16")',  # the instance: the inverted nanoGPT switch
        "self.cfg.bf16",  # a flag named for bf16
        '(cfg.dtype in ("bf16", "bfloat16"))',  # membership in bf16 spellings
        "(self.dtype is torch.bfloat16)",
        "(cfg.use_amp and cfg.use_bf16)",  # a conjunction: only ever on in bf16 runs
    ],
)
def test_a_scaler_enabled_by_the_bf16_setting_is_reported(switch: str) -> None:
    assert _gt011(_DDP_TRAINER.format(switch=switch)) == [12]


@pytest.mark.parametrize(
    "switch",
    [
        '(self.cfg.dtype == "float16")',  # the right switch
        "not self.cfg.bf16",
        '(self.cfg.dtype != "bfloat16")',
        "(cfg.use_amp or cfg.bf16)",
        "self.cfg.fp16",
    ],
)
def test_the_float16_switch_and_negations_stay_silent(switch: str) -> None:
    assert _gt011(_DDP_TRAINER.format(switch=switch)) == []


def test_a_name_bound_to_the_bf16_test_is_read_through() -> None:
    source = """\
import argparse
import torch
from accelerate import Accelerator

args = argparse.ArgumentParser().parse_args()
accelerator = Accelerator()
use_scaler = args.precision == "bf16"
scaler = torch.amp.GradScaler("cuda", enabled=use_scaler)
"""
    assert _gt011(source) == [8]


def test_a_sharded_scaler_under_fsdp_with_the_bf16_flag() -> None:
    source = """\
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler


def main(args, model):
    dist.init_process_group("nccl")
    model = FSDP(model)
    scaler = ShardedGradScaler(enabled=args.train.is_bfloat16)
    return model, scaler
"""
    assert _gt011(source) == [10]


def test_fabric_precision_text_compared_with_bf16_mixed() -> None:
    source = """\
import torch
from lightning.fabric import Fabric

fabric = Fabric(precision=PRECISION)
fabric.launch()
scaler = torch.cuda.amp.GradScaler(enabled=PRECISION == "bf16-mixed")
"""
    assert _gt011(source) == [6]
