"""A script the repository only ever runs as ``python script.py``: one process.

A training script may import ``torch.distributed``, build an ``Accelerator`` or call
``deepspeed.initialize`` and still run as one process in every run the repository ships: its
run script says ``python train_grpo.py --config grpo.yaml``, its README ``python problem.py``.
Started that way, ``Accelerator()`` wraps nothing, ``init_process_group`` makes a group of
one, and a write with no rank guard has one writer: what the file does in a group of several
is no bug of the runs the repository documents (the convention of the evaluation sets, issue
33), as for code nothing runs.

A file counts as launched alone when:

- some shell script, README or notebook of its repository runs it with a plain interpreter
  (``python train.py``, ``CUDA_VISIBLE_DEVICES=0 nohup python -u scripts/train.py ...``,
  ``python -m scripts.train``), with no rank or world size on the command line;
- no text of the repository (its Python files, this one's docstring included) names it after
  a launcher of several processes (``torchrun``, ``deepspeed``, ``accelerate launch``,
  ``python -m torch.distributed.launch``, ``srun``, ``mpirun``, a launcher held in a shell
  variable such as ``$LAUNCHER train.py``);
- the file starts no processes of its own (``mp.spawn``, Fabric, Lightning, ``submitit``,
  ``notebook_launcher``, a subprocess: :data:`_SELF_LAUNCH`), and reads no variable only a
  launcher sets (``os.environ["LOCAL_RANK"]``, ``--local_rank``: :data:`_LAUNCHER_READ`):
  such a file is written for a launcher, and its plain launch is its one-GPU mode.

A mention names the file when its path ends with the file's path in the repository, or it is
the bare name of the only file so named. A name no launch mentions keeps its reading: it may be
the entry point of a launch the lint does not see.

Example:
    >>> import ast, tempfile
    >>> from pathlib import Path
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> def repository(readme):
    ...     root = Path(tempfile.mkdtemp())
    ...     _ = (root / ".git").mkdir()
    ...     _ = (root / "train.py").write_text("import torch.distributed as dist\\n")
    ...     _ = (root / "run.sh").write_text("CUDA_VISIBLE_DEVICES=0 python train.py --lr 1\\n")
    ...     _ = (root / "README.md").write_text(readme)
    ...     return ModuleFacts(ast.parse("import torch"), str(root / "train.py"))
    >>> launched_alone(repository("Train: `python train.py`\\n"))
    True
    >>> launched_alone(repository("torchrun --nproc_per_node 8 train.py\\n"))
    False
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shlex
from collections.abc import Iterable

from gpu_training.diagnostics.lint.model import ModuleFacts
from gpu_training.diagnostics.lint.repo_files import file_paths, read_files, repository_of
from gpu_training.diagnostics.lint.summary import Summary

__all__ = ["launched_alone", "shipped_runs_only"]

_TEXTS = (".sh", ".bash", ".slurm", ".sbatch", ".md", ".rst", ".txt", ".ipynb", "Makefile")
"""Where a repository documents how its scripts run."""

_ANY = "*"
"""A launch whose script is a shell variable (``torchrun "${PY_ARGS[@]}"``): any file."""

_LAUNCHERS = frozenset(
    {
        "torchrun",
        "deepspeed",
        "accelerate",
        "torch.distributed.launch",
        "torch.distributed.run",
        "srun",
        "mpirun",
        "mpiexec",
        "horovodrun",
        "jsrun",
        "aprun",
        "colossalai",
        "lightning",
        "fabric",
        "composer",
    }
)
"""Command words that start several processes of the script they are given."""

_RANKED = re.compile(
    r"(?:^|\s)(?:--?(?:local[_-]?rank|rank|node[_-]?rank|world[_-]?size|nproc\w*|nnodes|"
    r"num[_-]?(?:processes|nodes)|master[_-](?:addr|port)|dist[_-]url)\b|"
    r"(?:RANK|LOCAL_RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|NODE_RANK)=)",
    re.IGNORECASE,
)
"""A command that hands the script a rank or a world size: one of several processes."""

_MENTIONS = re.compile(
    r"\.py\b|\s-m\s|"
    + "|".join(re.escape(w) for w in sorted(_LAUNCHERS))
    + r"|torch\.distributed\.|accelerate\.|deepspeed\.|lightning\."
)
"""A quick look before reading a text line by line: a script, a module run with ``-m``, a
launcher word or a launcher module (a superset of what the line readers below accept)."""
_PYTHON = re.compile(r"^(?:python|pypy)[\d.]*$")
_PY_FLAGS = re.compile(r"^-[uBOISsWXE]\w*$")

_SELF_LAUNCH = re.compile(
    r"\bspawn\b|\bmultiprocessing\b|\bProcess\(|\bsubprocess\b|\bPopen\b|os\.system|"
    r"\bsubmitit\b|notebook_launcher|debug_launcher|elastic_launch|\btorchrun\b|"
    r"torch\.distributed\.(?:run|launch)\b|\bmpirun\b|\bsrun\b|\bray\b|\blightning\b|"
    r"pytorch_lightning|\bFabric\b|\btorchx\b|\bhorovod\b|\bxmp\b|\bidist\b|\bignite\b|"
    r"\bhydra\b"
)
"""What a file uses to start processes itself (a Hydra app's launcher, too, is configuration:
``hydra/launcher=submitit_slurm`` starts it as SLURM tasks)."""

_MAX_MODULES = 200

_LAUNCHER_READ = re.compile(r"""["'](?:LOCAL_RANK|RANK|WORLD_SIZE)["']|--local[_-]rank\b""")
"""A variable or option only a launcher sets, read by the file: it is written for one (its
plain ``python`` launch is the one-GPU mode, ``torchrun`` the other, documented or not)."""


def shipped_runs_only(facts: ModuleFacts) -> bool:
    """Whether the lint judges the runs the repository ships (the default), so that code only
    an unshipped launch reaches reports nothing (``gpu-training lint --unshipped`` turns it
    off: :attr:`~gpu_training.diagnostics.lint.project.Project.shipped_only`)."""
    return facts.resolver is None or facts.resolver.shipped_only


def launched_alone(
    facts: ModuleFacts, spawns: bool = False, helpers: Iterable[Summary] = ()
) -> bool:
    """Whether every launch of the file the repository documents is one plain process.

    Args:
        facts: The file's module (its path finds the repository; its imports, the project
            modules it runs).
        spawns: The file starts processes itself (``mp.spawn``).
        helpers: What the project's functions it calls do (one that spawns starts processes).

    Returns:
        True when at least one plain ``python`` launch names it, no launcher of several
        processes does, and neither the file nor a project module it imports starts
        processes (see the module's docstring).
    """
    path = facts.path
    if spawns or path in ("", "<string>") or not path.endswith(".py"):
        return False
    if not shipped_runs_only(facts):
        return False  # `--unshipped`: a launch the repository does not document counts too
    if any(s.spawns for s in helpers):
        return False
    key = ("launched-alone", path)
    found = facts.memo.get(key)
    if found is None:
        found = facts.memo[key] = _alone(os.path.abspath(path)) and not _imports_launcher(facts)
    return bool(found)


def _imports_launcher(facts: ModuleFacts) -> bool:
    """A project module the file imports, directly or through others, can start processes
    (:data:`_SELF_LAUNCH`: ``train_ssl.py`` builds the Fabric that ``run_ssl.py`` calls)."""
    resolver = facts.resolver
    if resolver is None:
        return False
    seen = {facts.path}
    todo = [facts]
    while todo and len(seen) < _MAX_MODULES:
        module = todo.pop()
        for node in module.nodes:
            if isinstance(node, ast.ImportFrom):
                targets = [(node.module or "", node.level)]
                targets += [
                    (f"{node.module or ''}.{a.name}".lstrip("."), node.level) for a in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [(a.name, 0) for a in node.names]
            else:
                continue
            for name, level in targets:
                found = resolver.module_facts(module, name, level)
                if found is None or found.path in seen:
                    continue
                seen.add(found.path)
                if _launches_itself(found.path):
                    return True
                todo.append(found)
    return len(seen) >= _MAX_MODULES  # too many to read: say nothing


@functools.lru_cache(maxsize=1024)
def _launches_itself(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return _SELF_LAUNCH.search(handle.read()) is not None
    except OSError:
        return False


@functools.lru_cache(maxsize=1024)
def _alone(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return False
    if _SELF_LAUNCH.search(text) or _LAUNCHER_READ.search(text):
        return False
    root = repository_of(path)
    plain, launched = _launches(root)
    names = _names(root, path)
    return any(_names_it(m, names) for m in plain) and not any(
        _names_it(m, names) for m in launched
    )


def _names_it(mention: str, names: frozenset[str]) -> bool:
    """Whether a mentioned script path (``/home/u/proj/scripts/train.py``) is the file."""
    return mention == _ANY or any(mention == name or mention.endswith("/" + name) for name in names)


def _names(root: str, path: str) -> frozenset[str]:
    """The spellings that name the file: its repository path and each shorter tail of it,
    down to the bare name only when no other Python file of the repository has that name,
    each also as a module (``scripts/train.py`` and ``scripts.train``)."""
    relative = os.path.relpath(path, root).replace(os.sep, "/")
    parts = relative.split("/")
    base = parts[-1]
    unique = sum(1 for p in _python_files(root) if p.rsplit("/", 1)[-1] == base) <= 1
    found: set[str] = set()
    for i in range(len(parts)):
        if i == len(parts) - 1 and not unique:
            break
        found.add("/".join(parts[i:]))
    return frozenset(found)


@functools.lru_cache(maxsize=64)
def _python_files(root: str) -> tuple[str, ...]:
    return tuple(os.path.relpath(p, root).replace(os.sep, "/") for p in file_paths(root, (".py",)))


@functools.lru_cache(maxsize=64)
def _launches(root: str) -> tuple[frozenset[str], frozenset[str]]:
    """The script spellings the repository runs with a plain interpreter, and those it names
    after a launcher of several processes (any text, Python included)."""
    plain: set[str] = set()
    launched: set[str] = set()
    for path, text in read_files(root, _TEXTS):
        if not _MENTIONS.search(text):
            continue
        for command in _commands(text, notebook=path.endswith(".ipynb")):
            kind, script = _read(command)
            if script is not None:
                (plain if kind == "plain" else launched).add(script)
    for _, text in read_files(root, (".py", ".yaml", ".yml", ".json", ".toml", ".cfg")):
        if not _MENTIONS.search(text):
            continue
        for line in text.splitlines():
            words = re.findall(r"[\w./${}-]+", line)  # inside strings and lists alike
            if any(_launcher(w) or _launcher_module(w) for w in words):
                launched.update(_spelling(w) for w in words if _script(w))
    return frozenset(plain), frozenset(launched)


def _commands(text: str, notebook: bool) -> list[str]:
    """The command lines of a text (continued lines joined; a notebook's JSON strings and
    shell escapes read as lines; each ``;``/``&&``/``|`` segment its own command; a line
    commented out read too: ``# torchrun ... train.py`` documents a launch)."""
    if notebook:
        text = text.replace("\\n", "\n").replace('\\"', '"')
    commands: list[str] = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if notebook:
            line = line.strip('",')
        line = re.sub(r"^(?:[#!%> `]|\$\s)+", "", line)  # `# torchrun ...` counts; `$ ` prompts
        for segment in re.split(r"&&|\|\||;|\|", line):
            if segment.strip():
                commands.append(segment.strip())
    return commands


def _read(command: str) -> tuple[str, str | None]:
    """``("plain", script)`` for a plain interpreter run, ``("launched", script)`` for a
    script named after a launcher (or a variable that may hold one, or with a rank on the
    line), ``("", None)`` for a line that runs no script."""
    words = _words(command)
    named = any(
        _script(w) or (i > 0 and words[i - 1] in ("-m", "--module") and not _launcher_module(w))
        for i, w in enumerate(words)
    )
    if not named and any(_launcher(w) or _launcher_module(w) for w in words):
        # `torchrun --nproc_per_node=4 "${PY_ARGS[@]}"`: any script may be the one
        return ("launched", _ANY) if any(w.startswith("$") for w in words) else ("", None)
    for i, word in enumerate(words):
        module = i > 0 and words[i - 1] in ("-m", "--module")
        if not (_script(word) or module) or (module and _launcher_module(word)):
            continue
        before = words[: i - 1] if module else words[:i]
        script = _spelling(word, module)
        launcher = any(_launcher(w) or _launcher_module(w) or "$" in w for w in before)
        if launcher or _RANKED.search(command):
            return "launched", script
        while before and _PY_FLAGS.match(before[-1]):
            before = before[:-1]
        if before and _PYTHON.match(before[-1].rsplit("/", 1)[-1]):
            return "plain", script  # `python -u train.py`, after prose or `VAR=x nohup`
        return "", None
    return "", None


def _words(line: str) -> list[str]:
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    return [w.strip("`") for w in words]


def _launcher(word: str) -> bool:
    return word.rsplit("/", 1)[-1].strip("`'\"") in _LAUNCHERS


def _launcher_module(word: str) -> bool:
    """``torch.distributed.launch``, ``accelerate.commands.launch``,
    ``deepspeed.launcher.runner``: a launcher run as ``python -m``."""
    return word.startswith(("torch.distributed.", "accelerate.", "deepspeed.", "lightning."))


def _script(word: str) -> bool:
    return word.strip("`'\"").endswith(".py")


def _spelling(word: str, module: bool = False) -> str:
    """A script as mentioned, without quotes or ``./``; a module as its path
    (``scripts.train`` -> ``scripts/train.py``)."""
    word = word.strip("`'\"").removeprefix("./")
    if module and not word.endswith(".py"):
        word = word.replace(".", "/") + ".py"
    return word
