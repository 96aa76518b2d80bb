"""The built-in character-LM task and task resolution (gpu_training.tasks)."""

from __future__ import annotations

import collections
import math
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpu_training.config import ConfigError
from gpu_training.tasks import (
    Task,
    TaskError,
    cross_entropy_loss,
    resolve_import,
    resolve_task,
    task_from_imports,
)
from gpu_training.tasks.charlm import (
    Block,
    CharData,
    CharDataset,
    CharLMConfig,
    CharTokenizer,
    CharTransformer,
    build_datasets,
    load_corpus,
    loss_fn,
    unigram_baseline,
)

TINY = CharLMConfig(block_size=16, n_layer=1, n_head=2, n_embd=8)

# --- factories this module exposes as import strings ("test_tasks:...") ---------------------

NOT_CALLABLE = 42


def build_tiny_model(width: int = 4) -> nn.Module:
    return nn.Linear(3, width)


def build_tiny_data(n: int = 8) -> tuple[TensorDataset, TensorDataset]:
    gen = torch.Generator().manual_seed(0)
    train = TensorDataset(
        torch.randn(n, 3, generator=gen), torch.randint(0, 4, (n,), generator=gen)
    )
    return train, TensorDataset(torch.randn(2, 3), torch.randint(0, 4, (2,)))


def build_train_only() -> TensorDataset:
    return TensorDataset(torch.randn(4, 3), torch.randint(0, 4, (4,)))


def build_not_a_model() -> str:
    return "a string"


def make_tiny_task(width: int = 4) -> Task:
    return task_from_imports(
        "test_tasks:build_tiny_model", "test_tasks:build_tiny_data", model_kwargs={"width": width}
    )


def make_not_a_task() -> int:
    return 3


@pytest.fixture(scope="module")
def data64() -> CharData:
    return build_datasets(block_size=64, val_fraction=0.1)


# --- corpus, tokenizer, datasets ------------------------------------------------------------


def test_tokenizer_round_trips_the_corpus() -> None:
    text = load_corpus()
    assert len(text) > 300_000
    tok = CharTokenizer.from_text(text)
    assert tok.vocab_size == len(set(text)) == 72
    assert list(tok.chars) == sorted(set(text))
    ids = tok.encode(text)
    assert ids.dtype == torch.long and ids.shape == (len(text),)
    assert tok.decode(ids) == text
    assert tok.encode("A").item() == tok.chars.index("A")
    assert tok.decode([0, 1]) == tok.chars[:2]
    assert CharTokenizer.from_state_dict(tok.state_dict()).chars == tok.chars
    with pytest.raises(ValueError, match="outside the tokenizer's vocabulary: '~é'"):
        tok.encode("In the beginning~é")
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([72])


def test_dataset_windows_are_shifted_by_one() -> None:
    ds = CharDataset(torch.arange(100), block_size=8)
    assert len(ds) == (100 - 9) // 8 + 1 == 12
    for i in (0, 5, 11, -1):
        x, y = ds[i]
        start = (i % len(ds)) * 8
        assert x.shape == y.shape == (8,) and x.dtype == torch.long
        assert x.tolist() == list(range(start, start + 8))
        assert torch.equal(y, x + 1)
    with pytest.raises(IndexError):
        ds[12]
    strided = CharDataset(torch.arange(20), block_size=4, stride=2)
    assert len(strided) == 8 and strided[3][0].tolist() == [6, 7, 8, 9]
    assert torch.equal(ds.targets(), torch.cat([ds[i][1] for i in range(len(ds))]))
    with pytest.raises(ValueError, match="too few"):
        CharDataset(torch.arange(8), block_size=8)

    batch_x, batch_y = next(iter(DataLoader(ds, batch_size=4)))
    assert batch_x.shape == batch_y.shape == (4, 8)


def test_split_is_by_position_with_validation_at_the_tail(data64: CharData) -> None:
    text = load_corpus()
    n_train = len(data64.train.tokens)
    assert n_train == int(len(text) * 0.9)
    assert n_train + len(data64.val.tokens) == len(text)
    tok = data64.tokenizer
    assert tok.decode(data64.train.tokens) == text[:n_train]
    assert tok.decode(data64.val.tokens) == text[n_train:]  # the tail
    # No training window reaches into the validation text.
    _, last_y = data64.train[len(data64.train) - 1]
    last_start = (len(data64.train) - 1) * 64
    assert last_start + 64 < n_train
    assert tok.decode(last_y) == text[last_start + 1 : last_start + 65]
    x, y = data64.val[3]
    assert tok.decode(x) == text[n_train + 192 : n_train + 256]
    assert tok.decode(y) == text[n_train + 193 : n_train + 257]
    with pytest.raises(ValueError, match="val_fraction"):
        build_datasets(block_size=64, val_fraction=1.0)
    with pytest.raises(ValueError, match="validation split"):
        build_datasets(block_size=64, val_fraction=1e-5)


def test_unigram_baseline_matches_an_independent_computation(data64: CharData) -> None:
    text = load_corpus()
    n_train = int(len(text) * 0.9)
    counts = collections.Counter(text[:n_train])
    vocab = len(set(text))
    val_targets = text[n_train + 1 : n_train + 1 + len(data64.val) * 64]
    expected = -sum(math.log((counts[c] + 1) / (n_train + vocab)) for c in val_targets)
    expected /= len(val_targets)
    baseline = unigram_baseline(data64)
    assert baseline == pytest.approx(expected, abs=1e-9)
    assert 2.5 < baseline < 4.0
    # ≈ the entropy of the training text's character distribution.
    entropy = -sum(k / n_train * math.log(k / n_train) for k in counts.values())
    assert baseline == pytest.approx(entropy, abs=0.1)


# --- model ----------------------------------------------------------------------------------


def test_forward_shapes_and_block_layout() -> None:
    model = CharTransformer(TINY, vocab_size=5)
    assert model(torch.zeros(3, 16, dtype=torch.long)).shape == (3, 16, 5)
    assert model(torch.zeros(2, 7, dtype=torch.long)).shape == (2, 7, 5)
    assert isinstance(model.blocks, nn.ModuleList) and len(model.blocks) == 1
    assert type(model.blocks[0]) is Block and Block.__name__ == "Block"
    with pytest.raises(ValueError, match="exceeds the model's block_size 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_weight_tying_shares_storage_and_gradients() -> None:
    torch.manual_seed(0)
    model = CharTransformer(TINY, vocab_size=5)
    assert model.lm_head.weight is model.wte.weight
    assert model.lm_head.weight.data_ptr() == model.wte.weight.data_ptr()
    # An untied twin with the same values: the tied gradient is the sum of both ends' gradients.
    twin = CharTransformer(TINY, vocab_size=5)
    twin.load_state_dict(model.state_dict())
    twin.lm_head.weight = nn.Parameter(model.wte.weight.detach().clone())
    idx = torch.tensor([[0, 1, 2, 1, 0, 2]])  # token 3 and 4 never appear as inputs
    targets = torch.tensor([[1, 2, 3, 0, 4, 3]])
    loss_fn(model(idx), targets).backward()
    loss_fn(twin(idx), targets).backward()
    grad = model.wte.weight.grad
    assert grad is not None and twin.wte.weight.grad is not None
    assert twin.lm_head.weight.grad is not None
    torch.testing.assert_close(grad, twin.wte.weight.grad + twin.lm_head.weight.grad)
    assert grad[3].abs().sum() > 0  # only the head can have sent this row a gradient
    assert twin.wte.weight.grad[3].abs().sum() == 0


def test_attention_is_causal() -> None:
    torch.manual_seed(0)
    model = CharTransformer(TINY, vocab_size=5).eval()
    idx = torch.randint(0, 5, (2, 16))
    changed = idx.clone()
    changed[:, 9] = (idx[:, 9] + 1) % 5
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :9], b[:, :9], rtol=0, atol=1e-6)
    assert (a[:, 9:] - b[:, 9:]).abs().amax() > 1e-4


def test_parameter_count_and_flops_by_hand() -> None:
    model = CharTransformer(TINY, vocab_size=5)  # V=5, C=8, L=1, H=2, Q=4, block T=16
    # wte 5·8 = 40 (shared with the head), wpe 16·8 = 128, ln_f 2·8 = 16, one block:
    # ln_1 16 + c_attn 8·24+24 = 216 + c_proj 8·8+8 = 72 + ln_2 16 + c_fc 8·32+32 = 288
    # + mlp.c_proj 32·8+8 = 264 -> 872.
    assert model.num_parameters(non_embedding=False) == 40 + 128 + 16 + 872 == 1056
    assert model.num_parameters() == 1056 - 128 == 928
    # 6N + 12·L·H·Q·T
    assert model.flops_per_token() == 6 * 928 + 12 * 1 * 2 * 4 * 16 == 7104
    assert model.flops_per_token(seq_len=4) == 6 * 928 + 12 * 1 * 2 * 4 * 4
    no_bias = CharTransformer(
        CharLMConfig(block_size=16, n_layer=1, n_head=2, n_embd=8, bias=False), 5
    )
    assert no_bias.num_parameters() == 928 - (24 + 8 + 32 + 8) - 3 * 8  # linear + LayerNorm biases


def test_init_scales() -> None:
    torch.manual_seed(0)
    cfg = CharLMConfig(block_size=64, n_layer=4, n_head=4, n_embd=256)
    model = CharTransformer(cfg, vocab_size=72)
    block = model.blocks[0]
    assert isinstance(block, Block)
    assert block.attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert block.mlp.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.05)
    assert model.wte.weight.std().item() == pytest.approx(256**-0.5, rel=0.05)
    assert block.attn.c_attn.bias is not None and block.attn.c_attn.bias.abs().sum() == 0


def test_generate_extends_the_prompt() -> None:
    model = CharTransformer(TINY, vocab_size=5).eval()
    out = model.generate(torch.zeros(2, 3, dtype=torch.long), 20, generator=torch.Generator())
    assert out.shape == (2, 23) and int(out.max()) < 5


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("n_layer", {"n_layer": 0}),
        ("n_head", {"n_head": True}),
        ("n_embd", {"n_embd": 130}),
        ("block_size", {"block_size": 12.0}),
        ("dropout", {"dropout": 1.0}),
        ("val_fraction", {"val_fraction": 0}),
        ("bias", {"bias": "yes"}),
    ],
)
def test_config_rejects_bad_values(field: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=f"field '{field}'") as info:
        CharLMConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field and "\n" not in str(info.value)


def test_sixty_steps_beat_the_unigram_baseline(data64: CharData) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # CPU time below is then comparable to wall time on an idle core
    try:
        torch.manual_seed(0)
        cfg = CharLMConfig(block_size=64, n_layer=2, n_head=4, n_embd=64)
        model = CharTransformer(cfg, data64.tokenizer.vocab_size)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        loader = DataLoader(
            data64.train, batch_size=32, shuffle=True, drop_last=True,
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        start = time.process_time()
        batches = iter(loader)
        for _ in range(60):
            x, y = next(batches)
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        train_cpu_s = time.process_time() - start
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for x, y in DataLoader(data64.val, batch_size=256):
                total += loss_fn(model(x), y).item() * x.numel()
                count += x.numel()
    finally:
        torch.set_num_threads(threads)
    val_loss = total / count
    baseline = unigram_baseline(data64)
    print(
        f"charlm 60 steps: validation loss {val_loss:.3f} nats/char vs unigram baseline "
        f"{baseline:.3f} ({val_loss / baseline:.2f}x), {train_cpu_s:.1f} s CPU"
    )
    assert count == len(data64.val) * 64
    assert val_loss < 0.85 * baseline
    assert train_cpu_s < 20


# --- tasks ----------------------------------------------------------------------------------


def test_resolve_builtin_charlm() -> None:
    task = resolve_task("charlm", {"block_size": 32, "n_layer": 1, "n_embd": 32, "n_head": 2})
    assert task.name == "charlm" and "unigram baseline" in task.describe
    train, val = task.build_data()
    assert isinstance(train, CharDataset) and isinstance(val, CharDataset)
    assert train.block_size == 32
    assert task.baseline == pytest.approx(unigram_baseline(build_datasets(32)))
    model = task.build_model()
    assert isinstance(model, CharTransformer) and model.config.n_embd == 32
    assert task.build_model() is not model  # a fresh model per call
    x, y = train[0]
    assert task.loss_fn is loss_fn
    assert task.loss_fn(model(x[None]), y[None]).ndim == 0
    default = resolve_task("charlm")
    assert default.build_model().config == CharLMConfig()  # type: ignore[union-attr]


def test_charlm_option_errors_name_the_option() -> None:
    with pytest.raises(TaskError, match=r"no option 'n_embed' \(did you mean 'n_embd'\?\)") as info:
        resolve_task("charlm", {"n_embed": 64})
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="field 'n_head'"):
        resolve_task("charlm", {"n_head": 0})


def test_resolve_task_from_a_factory_import_string() -> None:
    task = resolve_task("test_tasks:make_tiny_task", {"width": 6})
    model = task.build_model()
    assert isinstance(model, nn.Linear) and model.out_features == 6
    train, val = task.build_data()
    assert len(train) == 8 and val is not None and len(val) == 2
    x, y = train[0]
    assert task.loss_fn(model(x[None]), y[None]).ndim == 0


def test_task_from_imports() -> None:
    task = task_from_imports(
        "test_tasks:build_tiny_model", "test_tasks:build_train_only", data_kwargs={}
    )
    assert task.name == "test_tasks:build_tiny_model" and task.loss_fn is cross_entropy_loss
    train, val = task.build_data()
    assert len(train) == 4 and val is None
    with_loss = task_from_imports(
        "test_tasks:build_tiny_model", "test_tasks:build_tiny_data", "torch.nn.functional:mse_loss"
    )
    assert with_loss.loss_fn is torch.nn.functional.mse_loss
    bad = task_from_imports("test_tasks:build_not_a_model", "test_tasks:build_tiny_data")
    with pytest.raises(TaskError, match=r"returned a str, expected a torch\.nn\.Module"):
        bad.build_model()


def test_default_loss_flattens_sequence_outputs() -> None:
    logits, targets = torch.randn(2, 5, 4), torch.randint(0, 4, (2, 5))
    flat = torch.nn.functional.cross_entropy(logits.reshape(10, 4), targets.reshape(10))
    torch.testing.assert_close(cross_entropy_loss(logits, targets), flat)
    torch.testing.assert_close(
        cross_entropy_loss(logits[:, 0], targets[:, 0]),
        torch.nn.functional.cross_entropy(logits[:, 0], targets[:, 0]),
    )


def _write_module(directory: Path, name: str, source: str) -> None:
    (directory / f"{name}.py").write_text(source, encoding="utf-8")


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("test_tasks.build_tiny_model", "has no colon"),
        ("test_tasks:", "Python names on both sides"),
        ("no_such_module_qz:build", "no module named 'no_such_module_qz'"),
        ("gpu_training.tasks.charml:build", "no module named 'gpu_training.tasks.charml' (did you mean 'charlm'?)"),
        ("tasks_broken_import:build", "importing module 'tasks_broken_import' failed: ModuleNotFoundError: No module named 'not_a_real_dependency_qz'"),
        ("tasks_broken_syntax:build", "importing module 'tasks_broken_syntax' failed: SyntaxError:"),
        ("tasks_raises:build", "importing module 'tasks_raises' failed: RuntimeError: needs a GPU"),
        ("test_tasks:build_tiny_modle", "has no attribute 'build_tiny_modle' (did you mean 'build_tiny_model'?)"),
        ("test_tasks:build_tiny_model.nope", "'test_tasks:build_tiny_model' has no attribute 'nope'"),
        ("test_tasks:NOT_CALLABLE", "'NOT_CALLABLE' is an int, not a callable"),
    ],
)  # fmt: skip
def test_import_string_errors_are_one_line(
    spec: str, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_module(tmp_path, "tasks_broken_import", "import not_a_real_dependency_qz\n")
    _write_module(tmp_path, "tasks_broken_syntax", "def build(:\n    pass\n")
    _write_module(tmp_path, "tasks_raises", "raise RuntimeError('needs a GPU\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TaskError) as info:
        resolve_import(spec)
    message = str(info.value)
    assert fragment in message
    assert f"'{spec}'" in message and "\n" not in message


def test_import_string_hint_when_cwd_is_not_on_sys_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_module(tmp_path, "hint_local_mod_qz", "def build(): return 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    with pytest.raises(TaskError, match=r"not on sys\.path: set PYTHONPATH=\."):
        resolve_import("hint_local_mod_qz:build")


@pytest.mark.parametrize(
    ("name", "options", "fragment"),
    [
        ("charml", None, "unknown task 'charml' (did you mean 'charlm'?)"),
        ("test_tasks:make_not_a_task", None, "returned an int, expected a gpu_training.tasks.Task"),
        ("test_tasks:make_tiny_task", {"widht": 3}, "does not take option 'widht' (did you mean 'width'?)"),
    ],
)  # fmt: skip
def test_resolve_task_errors_are_one_line(
    name: str, options: dict[str, object] | None, fragment: str
) -> None:
    with pytest.raises(TaskError) as info:
        resolve_task(name, options)
    assert fragment in str(info.value) and "\n" not in str(info.value)
    assert f"'{name}'" in str(info.value)
