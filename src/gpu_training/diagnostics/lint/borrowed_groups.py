"""A second entry script that only borrows another script's trainer: one process as written.

``problem.py`` of a small GPT project generates a toy data set, then runs ``TrainGPT(...)
.start()`` imported from ``train.py``, the project's trainer script, which joins a process
group only when a launcher's ``RANK`` is set. Nothing in ``problem.py`` reads a rank, guards a
write, calls ``torch.distributed`` or names a launcher's variable, and no shell script of the
repository starts it under ``torchrun``/``deepspeed``/``accelerate launch``: it is a script of
its own, run by hand as one process (``python problem.py``), and its data-set writes have one
writer. Had its author meant it to run once per GPU, something in it would tell the ranks
apart.

So a process group that a file reaches only through functions of *another entry script* (a
module with its own ``if __name__ == "__main__":``, the one the repository launches) does not
make the file distributed, when the file is an entry script itself and nothing in it is
rank-aware. A helper module without an entry block (``utils/dist.py``'s ``setup()``, a
library-style ``Trainer`` module) is what a launched script calls to join the group: a file
calling it stays distributed, as does any file that reads a rank (``args.local_rank``,
``dist.get_rank()``, ``accelerator.is_main_process``) or that the repository launches.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> script = ModuleFacts(ast.parse(
    ...     "from train import Trainer\\n"
    ...     "def main():\\n    Trainer().start()\\n"
    ...     "if __name__ == '__main__':\\n    main()\\n"))
    >>> rank_aware(script)
    False
"""

from __future__ import annotations

import ast
import os
import re

from gpu_training.diagnostics.lint.calls import has_main_block
from gpu_training.diagnostics.lint.hf_launch import written_for_a_launch
from gpu_training.diagnostics.lint.model import RANK_ATTRS, ModuleFacts
from gpu_training.diagnostics.lint.project import Project

__all__ = ["borrows_group", "entry_script", "group_from_helpers", "rank_aware"]

_RANKISH = re.compile(r"rank|is_main|main_process|is_master|master_process|world_size|zero_only")
_DISTRIBUTED_PACKAGES = (
    "torch.distributed",
    "accelerate",
    "deepspeed",
    "lightning",
    "pytorch_lightning",
)


def entry_script(facts: ModuleFacts) -> bool:
    """The module has an ``if __name__ == "__main__":`` block of its own."""
    return has_main_block(facts.tree)


def rank_aware(facts: ModuleFacts) -> bool:
    """Whether anything in the module tells processes apart or names a distributed package:
    a name or attribute about ranks or the main process, an import of ``torch.distributed``,
    Accelerate, DeepSpeed or Lightning, a launcher's variable, or a launch by the repository's
    shell scripts. Kept in ``facts.memo``."""
    cached = facts.memo.get("rank-aware")
    if isinstance(cached, bool):
        return cached
    found = False
    for node in facts.nodes:
        text = (
            node.id
            if isinstance(node, ast.Name)
            else node.attr
            if isinstance(node, ast.Attribute)
            else None
        )
        if text is not None and (text in RANK_ATTRS or _RANKISH.search(text.lower())):
            found = True
            break
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            modules.append(getattr(node, "module", None) or "")
            if any(m.startswith(_DISTRIBUTED_PACKAGES) for m in modules):
                found = True
                break
    found = found or written_for_a_launch(facts)
    facts.memo["rank-aware"] = found
    return found


def borrows_group(facts: ModuleFacts, creators: list[ModuleFacts]) -> bool:
    """Whether the group this file reaches through ``creators`` (the other modules whose
    functions it calls create the process group) leaves it one process: it is an entry
    script, nothing in it is rank-aware, and every creator is another entry script."""
    if facts.path in ("", "<string>") or not creators:
        return False
    if not entry_script(facts) or rank_aware(facts):
        return False
    here = os.path.abspath(facts.path)
    return all(entry_script(other) and os.path.abspath(other.path) != here for other in creators)


def group_from_helpers(facts: ModuleFacts, project: Project) -> bool:
    """Whether a function of another module that this file calls creates the process group,
    unless the file only borrows it from another entry script (:func:`borrows_group`)."""
    creators = [
        ref[0]
        for call in facts.calls
        for ref in facts.callees(call)
        if ref[0] is not facts and project.summary(ref).creates_group
    ]
    return bool(creators) and not borrows_group(facts, creators)
