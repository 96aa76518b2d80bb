"""``meta_device``: a model built for its shape alone is the same, without importing torch._dynamo.

A job is checked before it starts by building its model on ``meta`` (``train``, ``launch``,
``plan``, ``find-batch``). Under a bare ``torch.device("meta")`` the first ``normal_`` (an
``nn.Embedding``'s init, an HF model's ``_init_weights``) runs torch's Python reference and
imports ``torch._dynamo`` and sympy: 0.8 s of every ``train`` here. These tests show the
structure is unchanged on real models (the built-in transformer, HF Llama and GPT-2 from
their configs, torch's own layers) and that the import is gone (a fresh interpreter; the
bare context is the control that shows the check can fail).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
from torch import nn

from dist_harness import REPO_ROOT, run_python
from gpu_training.meta_device import meta_device


def _signature(model: nn.Module) -> list[tuple[str, tuple[int, ...], torch.dtype, str]]:
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return [(name, tuple(t.shape), t.dtype, t.device.type) for name, t in tensors]


def _charlm() -> nn.Module:
    from gpu_training.tasks.charlm import CharLMConfig, CharTransformer

    return CharTransformer(CharLMConfig(n_layer=2, n_head=2, n_embd=32, block_size=16), 72)


def _hf(config_file: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        transformers = pytest.importorskip("transformers")
        config = transformers.AutoConfig.for_model(
            **json.loads((REPO_ROOT / "configs" / "hf" / config_file).read_text())
        )
        return transformers.AutoModelForCausalLM.from_config(config)

    return build


def _gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=64)
    return transformers.GPT2LMHeadModel(config)


def _torch_layers() -> nn.Module:
    model = nn.Sequential(
        nn.Embedding(100, 16),
        nn.TransformerEncoderLayer(16, 2, 32, batch_first=True),
        nn.Conv1d(16, 8, 3),
        nn.LayerNorm(8),
        nn.LSTM(8, 8),
    )
    for p in model.parameters():  # the initialisers timm and HF use
        if p.dim() > 1:
            nn.init.trunc_normal_(p, std=0.02)
            nn.init.orthogonal_(p)
    return model


BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "charlm": _charlm,
    "hf-llama": _hf("tiny_llama.json"),
    "hf-gpt2": _gpt2,
    "torch-layers": _torch_layers,
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_the_shape_is_the_one_torch_device_meta_builds(name: str) -> None:
    build = BUILDERS[name]
    with torch.device("meta"):
        expected = _signature(build())
    with meta_device():
        got = _signature(build())
    assert got == expected
    assert got and all(device == "meta" for *_, device in got)


def test_tensors_with_values_still_get_them() -> None:
    """Only meta tensors skip the ops: a CPU tensor made inside is initialised as usual."""
    with meta_device():
        real = torch.zeros(1000, device="cpu")
        nn.init.normal_(real)
        real.clamp_(-1.0, 1.0)
    assert real.device.type == "cpu" and real.std() > 0.3 and real.abs().max() <= 1.0


_FRESH = """
import sys, torch
from gpu_training.tasks.charlm import CharLMConfig, CharTransformer
from gpu_training.meta_device import meta_device
context = meta_device() if sys.argv[1] == "meta_device" else torch.device("meta")
with context:
    CharTransformer(CharLMConfig(n_layer=1, n_head=2, n_embd=32, block_size=16), 72)
print("torch._dynamo" in sys.modules, "sympy" in sys.modules)
"""


@pytest.mark.parametrize(
    ("context", "imported"), [("meta_device", "False False"), ("torch.device", "True True")]
)
def test_building_on_meta_imports_no_dynamo(context: str, imported: str) -> None:
    proc = run_python(["-c", _FRESH, context], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == imported.split(), proc.stdout
