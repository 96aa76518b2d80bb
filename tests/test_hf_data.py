"""Files to packed windows (``gpu_training.tasks.hf_data``): formats, masks, the cache, bad files.

The tokenizer is the shipped 512-token byte-level BPE (``configs/hf/tokenizer``); the files
are written per test. Two processes asking for the same cache at once tokenize it once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dist_harness import REPO_ROOT, run_ranks
from gpu_training.config import ConfigError
from gpu_training.tasks.hf_data import DataSpec, PackedWindows, build_datasets, prepare_tokens

TOKENIZER = REPO_ROOT / "configs" / "hf" / "tokenizer"
CORPUS = REPO_ROOT / "src" / "gpu_training" / "tasks" / "data" / "kjv_selections.txt"
DOCS = [
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light.",
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)


def _prepare(files: list[Path], tok: Any, cache: Path, **fields: Any) -> Any:
    return prepare_tokens(DataSpec(tuple(files), **fields), tok, cache, tokenizer_dir=TOKENIZER)


def _ids(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_windows_are_shifted_by_one_and_cover_the_stream_once() -> None:
    windows = PackedWindows.from_arrays(np.arange(21, dtype=np.uint16), None, block_size=5)
    assert len(windows) == 4  # (21 - 1) // 5
    inputs = torch.cat([windows[i][0] for i in range(len(windows))])
    assert inputs.tolist() == list(range(20))
    for i in range(len(windows)):
        x, y = windows[i]
        assert torch.equal(x[1:], y[:-1]) and y[-1] == x[-1] + 1 and x.dtype == torch.int64
    with pytest.raises(IndexError):
        windows[4]


def test_jsonl_parquet_and_text_give_the_documents_with_eos(tmp_path: Path, tokenizer: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS)))
    parquet = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": DOCS}), parquet)
    eos = tokenizer.eos_token_id
    expected = [t for d in DOCS for t in [*_ids(tokenizer, d), eos]]
    for path in (jsonl, parquet):
        cache = _prepare([path], tokenizer, tmp_path / "cache")
        assert cache.tokens().tolist() == expected, path.suffix
        assert cache.num_documents == 2 and cache.mask() is None
    text = tmp_path / "doc.txt"
    text.write_text("\n".join(DOCS) + "\n")  # a text file is one document
    cache = _prepare([text], tokenizer, tmp_path / "cache")
    assert cache.tokens().tolist() == [*_ids(tokenizer, text.read_text()), eos]


def test_instruction_data_scores_only_the_response_and_eos(tmp_path: Path, tokenizer: Any) -> None:
    path = tmp_path / "pairs.jsonl"
    pairs = [("Question: what is 2 plus 2?\nAnswer:", " 4"), ("Say hi.", " hi there")]
    path.write_text("".join(json.dumps({"q": p, "a": r}) + "\n" for p, r in pairs))
    cache = _prepare([path], tokenizer, tmp_path / "cache", prompt_field="q", response_field="a")
    tokens, mask = cache.tokens(), cache.mask()
    assert mask is not None and len(mask) == len(tokens)
    scored = [int(t) for t, m in zip(tokens, mask, strict=True) if m]
    eos = tokenizer.eos_token_id
    assert scored == [*_ids(tokenizer, " 4"), eos, *_ids(tokenizer, " hi there"), eos]
    windows = PackedWindows(cache, block_size=len(tokens) - 1)
    x, y = windows[0]
    kept = y[y != -100].tolist()
    assert kept == scored  # the targets are the scored tokens; every prompt target is -100
    assert torch.equal(x, torch.from_numpy(tokens[:-1].astype(np.int64)))


def test_tokenized_once_then_read_from_the_cache(tmp_path: Path, tokenizer: Any) -> None:
    data = tmp_path / "a.txt"
    data.write_text(CORPUS.read_text()[:20_000])
    first = _prepare([data], tokenizer, tmp_path / "cache")
    again = _prepare([data], tokenizer, tmp_path / "cache")
    assert first.built and not again.built and again.directory == first.directory
    assert np.array_equal(first.tokens(), again.tokens())
    copy = shutil.copy(data, tmp_path / "b.txt")  # the key is the contents, not the name
    assert not _prepare([Path(copy)], tokenizer, tmp_path / "cache").built
    data.write_text(data.read_text() + "More.\n")
    changed = _prepare([data], tokenizer, tmp_path / "cache")
    assert changed.built and changed.directory != first.directory
    assert sorted(p.name for p in first.directory.iterdir()) == ["meta.json", "tokens.bin"]


def test_a_split_holds_out_the_last_windows(tmp_path: Path, tokenizer: Any) -> None:
    data = tmp_path / "a.txt"
    data.write_text(CORPUS.read_text()[:20_000])
    spec = DataSpec((data,))
    train, val = build_datasets(
        spec, None, tokenizer, block_size=16, val_fraction=0.1, cache_dir=tmp_path / "c"
    )
    assert val is not None and len(val) == int((len(train) + len(val)) * 0.1)
    assert torch.equal(train[len(train) - 1][1][-1:], val[0][0][:1])  # adjacent, not shared
    none_held, nothing = build_datasets(
        spec, None, tokenizer, block_size=16, val_fraction=0.0, cache_dir=tmp_path / "c"
    )
    assert nothing is None and len(none_held) == len(train) + len(val)


def _prepare_in_rank(data: str, cache: str) -> bool:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    return prepare_tokens(DataSpec((Path(data),)), tok, cache, tokenizer_dir=TOKENIZER).built


def test_two_processes_at_once_tokenize_once(tmp_path: Path) -> None:
    data = tmp_path / "big.txt"
    data.write_text(CORPUS.read_text() * 3)  # ~1 MB: about a second of tokenizing
    built = run_ranks(_prepare_in_rank, 2, args=(str(data), str(tmp_path / "cache")), timeout=120)
    assert sorted(built) == [False, True]
    assert len([p for p in (tmp_path / "cache").iterdir() if p.is_dir()]) == 1


@pytest.mark.parametrize(
    ("name", "content", "fields", "fragment"),
    [
        ("bad.jsonl", '{"text": "a"}\n{"text": \n', {}, "bad.jsonl: line 2 is not JSON"),
        ("missing.jsonl", '{"body": "a"}\n', {}, "line 1 has no field 'text' (fields: body)"),
        ("number.jsonl", '{"text": 3}\n', {}, "line 1 field 'text' is int, not text"),
        ("list.jsonl", "[1, 2]\n", {}, "line 1 is not an object with fields"),
        ("data.csv", "a,b\n", {}, "data.csv: unknown type '.csv'"),
        ("fake.parquet", "not parquet", {}, "fake.parquet: not a readable Parquet file"),
        (
            "plain.txt",
            "text",
            {"prompt_field": "q", "response_field": "a"},
            "must be JSONL or Parquet",
        ),
        ("latin.txt", b"caf\xe9\n", {}, "latin.txt: not UTF-8 text"),
        ("empty.txt", "", {}, "no text to train on"),
    ],
)
def test_bad_data_files_are_one_line_naming_the_file(
    tmp_path: Path,
    tokenizer: Any,
    name: str,
    content: str | bytes,
    fields: dict[str, str],
    fragment: str,
) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        _prepare([path], tokenizer, tmp_path / "cache", **fields)
    message = str(info.value)
    assert fragment in message and "\n" not in message, message
    cache = tmp_path / "cache"
    assert not cache.exists() or not [p for p in cache.iterdir() if p.is_dir()], "left behind"


def test_a_parquet_file_without_the_column_names_the_columns(
    tmp_path: Path, tokenizer: Any
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"body": ["a"], "id": [1]}), path)
    with pytest.raises(ConfigError, match=r"no column 'text' \(columns: body, id\)"):
        _prepare([path], tokenizer, tmp_path / "cache")
