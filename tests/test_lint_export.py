"""``benchmarks/lint_export.py``: a truth set's repositories exported from fetched snapshots,
on a git repository made here (no fetched code)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def exporter():
    return load_benchmark("lint_export")


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env |= {"GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)
    return done.stdout.decode().strip()


def _snapshot(mirrors: Path) -> str:
    """A bare snapshot of owner/name with two commits; returns the first one."""
    work = mirrors.parent / "work"
    (work / "src").mkdir(parents=True)
    _git(work, "init", "-q")
    (work / "src" / "train.py").write_text("print('one')\n")
    (work / "run.sh").write_text("torchrun --nproc_per_node 2 src/train.py\n")
    _git(work, "add", "-A")
    _git(work, "commit", "-qm", "one")
    first = _git(work, "rev-parse", "HEAD")
    (work / "src" / "train.py").write_text("print('two')\n")
    _git(work, "commit", "-qam", "two")
    _git(mirrors, "clone", "-q", "--bare", str(work), "owner+name/repo")
    return first


def test_the_truth_commit_is_exported_with_a_git_marker(exporter, tmp_path: Path) -> None:
    mirrors = tmp_path / "mirror"
    mirrors.mkdir()
    first = _snapshot(mirrors)
    truth = tmp_path / "truth.csv"
    truth.write_text(
        "repo,commit,path,line,rule,verdict,why\n"
        f"owner/name,{first},src/train.py,1,GT007,bug,x\n"
        f"owner/name,{first},src/train.py,2,GT003,correct,y\n"
        f"other/missing,{first},a.py,1,GT007,bug,z\n"
    )
    out = tmp_path / "out"
    status = exporter.main([str(truth), "--out", str(out), "--mirrors", str(mirrors)])
    assert status == 1  # other/missing was never fetched
    export = out / "owner+name"
    assert (export / ".git").is_dir()
    assert (export / "src" / "train.py").read_text() == "print('one')\n"  # the truth's commit
    assert (export / "run.sh").is_file()
    assert not (out / "other+missing").exists()


def test_missing_lists_what_to_fetch_and_bad_arguments_exit_2(
    exporter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    truth = tmp_path / "truth.csv"
    truth.write_text("repo,commit,path,line,rule,verdict,why\nowner/name,abc,a.py,1,GT007,bug,x\n")
    assert exporter.main([str(truth), "--missing", "--mirrors", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "not fetched: owner/name"
    assert exporter.main([str(truth)]) == 2  # no --out
    assert exporter.main([str(tmp_path / "nope.csv"), "--out", str(tmp_path)]) == 2
