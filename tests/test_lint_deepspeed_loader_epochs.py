"""``gpu-training lint`` ``GT005``: epoch loops over the loader DeepSpeed builds.

``deepspeed.initialize(..., training_data=dataset)`` (and an engine's
``deepspeed_io(dataset)``) returns a ``DeepSpeedDataLoader`` over a ``DistributedSampler`` it
builds with the default ``shuffle=True``; its ``__iter__`` makes a fresh ``DataLoader`` over
that same sampler and never advances the epoch: without
``loader.data_sampler.set_epoch(epoch)`` every epoch replays one order. Minimal reproductions
written here (issue 33, set 16: contrastive pretraining scripts over DeepSpeed's loader).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_INITIALIZE = """\
import deepspeed
import torch


def main(args, model, dataset):
    engine, optimizer, {loader}, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), training_data={data}
    )
    for epoch in range(args.epochs):
{reseed}        for step, batch in enumerate({loader}):
            loss = engine(batch.to(engine.device)).mean()
            engine.backward(loss)
            engine.step()
"""

_DEEPSPEED_IO = """\
import deepspeed


class Runner:
    def __init__(self, cfg, model, dataset):
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=cfg
        )
        self.train_loader = self.engine.deepspeed_io(dataset)
        self.cfg = cfg

    def fit(self):
        for epoch in range(self.cfg["epochs"]):
            for batch in self.train_loader:
                self.engine.backward(self.engine(batch).mean())
                self.engine.step()


if __name__ == "__main__":
    Runner(load_config(), build_model(), build_dataset()).fit()
"""

_CASES = {
    "initialize_trainloader": _INITIALIZE.format(loader="trainloader", data="dataset", reseed=""),
    "initialize_other_name": _INITIALIZE.format(loader="train_loader", data="dataset", reseed=""),
    "deepspeed_io": _DEEPSPEED_IO,
}


def _codes(tmp_path: Path, source: str) -> set[str]:
    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_text(source)
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return {f.code for f in report.findings}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_an_epoch_loop_over_deepspeeds_loader_without_set_epoch_is_gt005(
    tmp_path: Path, case: str
) -> None:
    assert "GT005" in _codes(tmp_path, _CASES[case])


def test_reseeding_deepspeeds_sampler_is_not_gt005(tmp_path: Path) -> None:
    source = _INITIALIZE.format(
        loader="trainloader",
        data="dataset",
        reseed="        trainloader.data_sampler.set_epoch(epoch)\n",
    )
    assert "GT005" not in _codes(tmp_path, source)


def test_no_training_data_is_not_gt005(tmp_path: Path) -> None:
    source = _INITIALIZE.format(loader="trainloader", data="None", reseed="").replace(
        "enumerate(trainloader)", "enumerate(make_loader())"
    )
    assert "GT005" not in _codes(tmp_path, source)
