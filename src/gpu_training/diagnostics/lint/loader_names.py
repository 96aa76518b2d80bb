"""The key that names a ``DataLoader`` in a mapping (``GT003``'s evaluation loaders).

``GT003`` leaves out loaders whose name says validation, evaluation or test data. Projects
often keep their loaders and datasets in dicts keyed by split: ``dataloaders = {"train":
DataLoader(image_datasets["train"], sampler=...), "val": DataLoader(image_datasets["val"])}``.
The key is the name there: the ``"val"`` loader is the validation one. A loader a project
helper returns with other values is named by the one unpacked name that says ``loader``
(``val_loader, num_query, _ = get_testloader(cfg)``).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> tree = ast.parse("loaders = {'val': DataLoader(sets['val'])}\\n")
    >>> facts = ModuleFacts(tree)
    >>> call = tree.body[0].value.values[0]
    >>> mapping_key(facts, call, call.args[0]), mapping_key(facts, call, None)
    ('val', 'val')
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import parents
from gpu_training.diagnostics.lint.model import ModuleFacts

__all__ = ["mapping_key", "unpacked_loader_name"]


def mapping_key(facts: ModuleFacts, call: ast.Call, data: ast.expr | None) -> str | None:
    """The string that names a loader in a mapping: the dataset's key (``DataLoader(
    image_datasets["val"])``) or the loader's own (``{"val": DataLoader(...)}``)."""
    if isinstance(data, ast.Subscript) and isinstance(data.slice, ast.Constant):
        return str(data.slice.value)
    holder = parents(facts).get(id(call))
    if isinstance(holder, ast.Dict):
        index = next(i for i, v in enumerate(holder.values) if v is call)
        key = holder.keys[index]
        return str(key.value) if isinstance(key, ast.Constant) else None
    return None


def unpacked_loader_name(facts: ModuleFacts, call: ast.Call) -> str | None:
    """The one name that says ``loader`` among the names a call's result is unpacked into
    (``aug_loader, num_query, _ = get_testloader(cfg)``), or None."""
    holder = parents(facts).get(id(call))
    if not (isinstance(holder, ast.Assign) and len(holder.targets) == 1):
        return None
    target = holder.targets[0]
    if not isinstance(target, (ast.Tuple, ast.List)):
        return None
    names = [e.id for e in target.elts if isinstance(e, ast.Name) and "loader" in e.id.lower()]
    return names[0] if len(names) == 1 else None
