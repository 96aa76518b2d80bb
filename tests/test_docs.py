"""Documentation that runs: every ```python block in docs/*.md and every module's doctests."""

from __future__ import annotations

import doctest
import importlib
import re
import tempfile
from pathlib import Path

import pytest
import yaml

from dist_harness import run_python

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)

SRC = ROOT / "src"
# An example line that runs: ``>>> `` without ``+SKIP`` (those need ranks or a GPU).
_RUNNABLE_EXAMPLE = re.compile(r"^\s*>>> (?!.*doctest: \+SKIP).*$", re.M)
# Every module with a runnable docstring example runs it: found, not listed, so none is
# forgotten.
DOCTEST_MODULES = sorted(
    ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
    for path in (SRC / "gpu_training").rglob("*.py")
    if _RUNNABLE_EXAMPLE.search(path.read_text(encoding="utf-8"))
)


def python_blocks(path: Path) -> list[str]:
    """The ```python fenced blocks of a Markdown file, in order."""
    return _BLOCK.findall(path.read_text(encoding="utf-8"))


def test_docs_exist_and_have_code() -> None:
    assert DOCS, "docs/ must hold the guides"
    assert all(python_blocks(p) for p in DOCS)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_doc_python_blocks_run_in_order(doc: Path, tmp_path: Path) -> None:
    blocks = python_blocks(doc)
    # One process, one namespace, top to bottom: later blocks build on earlier ones.
    script = tmp_path / f"{doc.stem}.py"
    script.write_text(
        "\n".join(f"# --- block {i}\n{block}" for i, block in enumerate(blocks)), encoding="utf-8"
    )
    (tmp_path / "tmp").mkdir()  # the examples' tempfile.mkdtemp() directories: pytest's to prune
    proc = run_python(
        [str(script)], timeout=150, cwd=tmp_path, env={"TMPDIR": str(tmp_path / "tmp")}
    )
    assert proc.returncode == 0, f"{doc.name}:\n{(proc.stdout + proc.stderr)[-4000:]}"


@pytest.mark.parametrize("name", DOCTEST_MODULES)
def test_module_doctests(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the examples' mkdtemp() go here
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"
    assert result.attempted > 0, f"{name} has no docstring examples"


_YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_doc_yaml_strategy_sections_validate(doc: Path) -> None:
    """Every ```yaml block with a ``strategy`` section is a valid strategy (as a job's is)."""
    from gpu_training.strategy import parse_strategy

    for block in _YAML_BLOCK.findall(doc.read_text(encoding="utf-8")):
        data = yaml.safe_load(block)
        if isinstance(data, dict) and "strategy" in data:
            parse_strategy(data["strategy"], source=doc.name)
