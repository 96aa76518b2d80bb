"""Training tasks: what to build (model, data, loss) for ``gpu-training train``.

A :class:`Task` is a bundle of three factories and a loss, nothing more::

    task = resolve_task("charlm", {"n_layer": 2})    # the built-in character transformer
    model = task.build_model()                        # a fresh nn.Module, on the CPU
    train_set, val_set = task.build_data()            # map-style datasets of (inputs, targets)
    loss = task.loss_fn(model(inputs), targets)       # a 0-d tensor: the micro-batch *mean*
    total, count = task.loss_sum(...)                 # or None: (sum, count) over scored targets

The loss is the mean over the micro-batch, or — when targets can be masked with an ignore
index (-100) — a pair ``(sum over scored targets, their count)`` that the Trainer divides by
the scored targets of the whole global batch (:mod:`gpu_training.step`): a per-micro-batch
mean over masked targets would make the gradient depend on the split. User tasks train
with :func:`cross_entropy_sum` by default. Every rank calls the factories itself.

Users plug their own job in two ways:

* import strings for the parts — ``model: mypkg.models:build`` and ``data: mypkg.data:build``
  in the config, :func:`task_from_imports` in Python;
* one import string for a factory returning a whole :class:`Task`:
  ``resolve_task("mypkg.tasks:make_task", options)`` calls ``make_task(**options)``.

Import strings are resolved by :func:`resolve_import`, which turns every way they can fail
into one :class:`TaskError` line naming the string.

Example:
    >>> task = resolve_task("charlm", {"n_layer": 1, "block_size": 32})
    >>> task.name, round(task.baseline, 2)
    ('charlm', 2.98)
    >>> train_set, val_set = task.build_data()
    >>> x, y = train_set[0]
    >>> task.loss_fn(task.build_model()(x[None]), y[None]).ndim
    0
    >>> resolve_import("math:sqrt")(16.0)
    4.0
    >>> resolve_task("charml")
    Traceback (most recent call last):
    ...
    gpu_training.tasks.TaskError: unknown task 'charml' (did you mean 'charlm'?): use a built-in task (charlm, hf) or an import string 'package.module:function' returning a Task
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import pkgutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn
from torch.utils.data import Dataset, IterableDataset

from gpu_training.config import ConfigError
from gpu_training.meta_device import meta_device
from gpu_training.streaming import SampleStream
from gpu_training.tasks.losses import (
    IGNORE_INDEX,
    count_scored,
    cross_entropy_loss,
    cross_entropy_sum,
)
from gpu_training.tasks.streams import char_stream

if TYPE_CHECKING:
    from gpu_training.job import JobConfig
from gpu_training.tasks import charlm

__all__ = [
    "BUILTIN_TASKS",
    "IGNORE_INDEX",
    "Task",
    "TaskError",
    "build_task",
    "charlm_task",
    "count_scored",
    "cross_entropy_loss",
    "cross_entropy_sum",
    "resolve_import",
    "resolve_task",
    "task_checkpoint_extra",
    "task_from_imports",
]

DataPair = tuple[Dataset[Any], Dataset[Any] | None]
"""What ``build_data`` returns: the training set and the validation set (or None)."""


class TaskError(ConfigError):
    """A task name, import string or task option does not resolve.

    A :class:`~gpu_training.config.ConfigError` (so a ``ValueError``): the message is one
    line naming the offending string, with a close-match suggestion where there is one.
    """


@dataclass
class Task:
    """What a training job trains: factories for the model and the data, and the loss.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> task = Task(
        ...     name="regression",
        ...     build_model=lambda: torch.nn.Linear(3, 1),
        ...     build_data=lambda: (TensorDataset(torch.randn(8, 3), torch.randn(8, 1)), None),
        ...     loss_fn=torch.nn.functional.mse_loss,
        ... )
        >>> task.build_data()[1] is None
        True
    """

    name: str
    """Short name for logs and metrics."""

    build_model: Callable[[], nn.Module]
    """Returns a freshly initialised model (on the CPU; the Trainer moves and wraps it)."""

    build_data: Callable[[], DataPair]
    """Returns ``(train, val)`` map-style datasets of ``(inputs, targets)``; ``val`` may be None.
    ``train`` may be a stream (:mod:`gpu_training.streaming`)."""

    loss_fn: Callable[[Tensor, Tensor], Any]
    """``loss_fn(model(inputs), targets)``: a 0-d tensor, the mean over the micro-batch — or
    a pair ``(sum over scored targets, their count)``, which the Trainer normalizes over the
    whole global batch."""

    loss_sum: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None
    """The loss as ``(sum over scored targets, their count)``, when targets can be masked
    (an ignore index): the Trainer trains with it, dividing by the scored targets of the whole
    global batch, so the split over ranks and micro-steps does not change the gradient."""

    count_targets: Callable[[Tensor], Tensor] | None = None
    """Scored targets in a micro-batch's targets, for a ``(sum, count)`` loss (default:
    those that are not ``IGNORE_INDEX``)."""

    describe: str = ""
    """One line for humans: what the model and data are."""

    baseline: float | None = None
    """A validation loss a trained model must clearly beat (e.g. a unigram model's)."""

    tokens_per_sample: int | None = None
    """Tokens in one sample (sequence models): the Trainer then logs tokens/s."""

    flops_per_token: int | None = None
    """Training FLOPs per token (``6N + 12·L·H·Q·T``): the Trainer then logs MFU on GPUs."""

    loader_workers: int = 0
    """DataLoader worker processes for a training stream (:mod:`gpu_training.streaming`)."""

    checkpoint_extra: Callable[[nn.Module], dict[str, Any]] | None = None
    """Plain data (numbers, strings, tensors, lists and dicts of them) the Trainer adds to
    every checkpoint's ``extra``, given the trained model: e.g. the Hugging Face task's
    config and tokenizer files, so ``ckpt export-hf`` needs no other input."""


# --- import strings -------------------------------------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _a_type(obj: object) -> str:
    """``"an int"``, ``"a str"``: the object's type with its article."""
    kind = type(obj).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


def _suggest(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _missing_module_message(spec: str, missing: str) -> str:
    parent_name, _, leaf = missing.rpartition(".")
    if parent_name:
        parent = sys.modules.get(parent_name)
        paths = list(getattr(parent, "__path__", []))
        siblings = [m.name for m in pkgutil.iter_modules(paths)]
    else:
        siblings = [m.name for m in pkgutil.iter_modules()]  # top-level modules on sys.path
    message = f"import string '{spec}': no module named '{missing}'{_suggest(leaf, siblings)}"
    top = missing.split(".")[0]
    cwd = Path.cwd()
    on_path = any(Path(p or ".").resolve() == cwd.resolve() for p in sys.path)
    if not on_path and ((cwd / f"{top}.py").exists() or (cwd / top).is_dir()):
        # torchrun and console scripts do not put the working directory on sys.path.
        message += (
            f"; '{top}' is in the current directory, which is not on sys.path: "
            f"set PYTHONPATH={os.curdir}"
        )
    return message


def resolve_import(spec: str) -> Callable[..., Any]:
    """The callable an import string ``"package.module:attribute"`` names.

    The attribute may be dotted (``"pkg.mod:Class.create"``). The module is imported (running
    its top-level code) the first time.

    Args:
        spec: ``module path`` + ``:`` + ``attribute path``.

    Returns:
        The callable object.

    Raises:
        TaskError: One line naming ``spec``, when it has no colon or is not made of Python
            names; the module does not exist (distinguished from a module whose own import
            fails, whose error is shown); the attribute is missing (with the closest public
            name); or the object is not callable.

    Example:
        >>> resolve_import("math:hypot")(3, 4)
        5.0
        >>> resolve_import("math:sqrtt")
        Traceback (most recent call last):
        ...
        gpu_training.tasks.TaskError: import string 'math:sqrtt': module 'math' has no attribute 'sqrtt' (did you mean 'sqrt'?)
    """
    if not isinstance(spec, str):
        raise TaskError(
            f"import string must be a string like 'package.module:function', got {spec!r}"
        )
    module_name, colon, attr_path = spec.strip().partition(":")
    if not colon:
        raise TaskError(
            f"import string '{spec}' has no colon: expected 'package.module:function' "
            "(module path, ':', then the attribute)"
        )
    module_ok = all(part.isidentifier() for part in module_name.split("."))
    attr_ok = all(part.isidentifier() for part in attr_path.split("."))
    if not (module_ok and attr_ok):
        raise TaskError(
            f"import string '{spec}': expected 'package.module:function' with Python names on "
            f"both sides of one colon"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise TaskError(_missing_module_message(spec, missing)) from None
        raise TaskError(
            f"import string '{spec}': importing module '{module_name}' failed: "
            f"{type(exc).__name__}: {_one_line(str(exc))}"
        ) from exc
    except Exception as exc:  # the user's module itself raised: show its error, not ours
        raise TaskError(
            f"import string '{spec}': importing module '{module_name}' failed: "
            f"{type(exc).__name__}: {_one_line(str(exc))}"
        ) from exc
    obj: Any = module
    done: list[str] = []
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            owner = f"'{module_name}:{'.'.join(done)}'" if done else f"module '{module_name}'"
            public = [name for name in dir(obj) if not name.startswith("_")]
            raise TaskError(
                f"import string '{spec}': {owner} has no attribute '{part}'{_suggest(part, public)}"
            ) from None
        done.append(part)
    if not callable(obj):
        raise TaskError(f"import string '{spec}': '{attr_path}' is {_a_type(obj)}, not a callable")
    return obj


def _check_kwargs(spec: str, func: Callable[..., Any], kwargs: Mapping[str, Any]) -> None:
    """Fails early, naming the option, when ``func(**kwargs)`` would not bind."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        params = [
            name
            for name, p in signature.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        unknown = [key for key in kwargs if key not in signature.parameters]
        if unknown and not any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values()):
            raise TaskError(
                f"'{spec}' does not take option '{unknown[0]}'{_suggest(unknown[0], params)}; "
                f"it takes: {', '.join(params) or 'no options'}"
            ) from None
        raise TaskError(f"'{spec}' cannot be called with {dict(kwargs)}: {exc}") from None


def task_from_imports(
    model: str,
    data: str,
    loss: str | None = None,
    *,
    model_kwargs: Mapping[str, Any] | None = None,
    data_kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> Task:
    """A task from import strings for the model factory, the data factory and the loss.

    The strings are resolved now, so a typo fails before any process starts; the factories
    run when the Trainer calls ``build_model`` / ``build_data`` (on every rank).

    Args:
        model: ``"pkg.mod:fn"``; ``fn(**model_kwargs)`` returns an ``nn.Module``.
        data: ``"pkg.mod:fn"``; ``fn(**data_kwargs)`` returns ``(train, val)`` datasets
            (``val`` may be ``None``) or a single training dataset. Each item is
            ``(inputs, targets)``.
        loss: ``"pkg.mod:fn"`` with ``fn(outputs, targets)`` returning a 0-d micro-batch mean
            or ``(sum, count)`` over scored targets (normalized over the global batch by the
            Trainer); default cross-entropy (:func:`cross_entropy_loss`, trained as
            :func:`cross_entropy_sum`: targets of -100 are not scored; 3-D outputs are
            ``(B, T, classes)``).
        model_kwargs: Keyword arguments for the model factory.
        data_kwargs: Keyword arguments for the data factory.
        name: Task name for logs (default: the model string).

    Returns:
        The :class:`Task`.

    Raises:
        TaskError: If a string does not resolve or an option is not accepted; later, from
            ``build_model``/``build_data``, if a factory returns the wrong kind of object.

    Example:
        >>> task = task_from_imports("torch.nn:Linear", "torch.utils.data:TensorDataset",
        ...                          model_kwargs={"in_features": 4, "out_features": 2})
        >>> task.build_model()
        Linear(in_features=4, out_features=2, bias=True)
    """
    model_fn, data_fn = resolve_import(model), resolve_import(data)
    loss_callable = cross_entropy_loss if loss is None else resolve_import(loss)
    m_kwargs, d_kwargs = dict(model_kwargs or {}), dict(data_kwargs or {})
    _check_kwargs(model, model_fn, m_kwargs)
    _check_kwargs(data, data_fn, d_kwargs)

    def build_model() -> nn.Module:
        built = model_fn(**m_kwargs)
        if not isinstance(built, nn.Module):
            raise TaskError(
                f"model factory '{model}' returned {_a_type(built)}, expected a torch.nn.Module"
            )
        return built

    def build_data() -> DataPair:
        built = data_fn(**d_kwargs)
        if isinstance(built, (tuple, list)) and len(built) == 2:
            train, val = built
        else:
            train, val = built, None
        for split, dataset in (("train", train), ("val", val)):
            if split == "val" and dataset is None:
                continue
            if split == "train" and isinstance(dataset, IterableDataset | SampleStream):
                continue  # a stream (docs/checkpointing.md#streaming-data)
            if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
                raise TaskError(
                    f"data factory '{data}' returned {_a_type(dataset)} as the {split} "
                    "set, expected a map-style dataset (with __len__ and __getitem__) or a "
                    "(train, val) pair"
                )
        return train, val

    described = f"model {model}, data {data}, loss {loss or 'cross-entropy'}"
    return Task(
        name=name or model,
        build_model=build_model,
        build_data=build_data,
        loss_fn=loss_callable,
        loss_sum=cross_entropy_sum if loss is None else None,
        describe=described,
    )


# --- built-in tasks -------------------------------------------------------------------------


def charlm_task(config: charlm.CharLMConfig | None = None) -> Task:
    """The built-in character-level transformer on the shipped corpus.

    Reads and tokenizes the corpus now (a few milliseconds) to know the vocabulary and the
    unigram baseline; ``build_model`` makes a fresh :class:`~.charlm.CharTransformer` per call.

    Args:
        config: Model and data shape (default :class:`~.charlm.CharLMConfig`).

    Returns:
        A :class:`Task` named ``"charlm"`` with its ``baseline`` set.

    Raises:
        TaskError: If ``block_size`` / ``val_fraction`` leave a split without one window.
    """
    cfg = charlm.CharLMConfig() if config is None else config
    try:
        data = charlm.build_datasets(cfg.block_size, cfg.val_fraction)
    except ValueError as err:  # the options do not fit the corpus: bad input, one line
        raise TaskError(f"task 'charlm': options block_size/val_fraction: {err}") from None
    vocab = data.tokenizer.vocab_size
    if cfg.vocab_size is not None:
        if cfg.vocab_size < vocab:
            raise TaskError(
                f"task 'charlm': option 'vocab_size' ({cfg.vocab_size}) must be at least the "
                f"corpus's {vocab} characters"
            )
        vocab = cfg.vocab_size  # padded rows are never targets: only the shape changes
    baseline = charlm.unigram_baseline(data)
    with meta_device():  # the shape only: no memory, no initialisation
        shape = charlm.CharTransformer(cfg, vocab)
    params = shape.num_parameters()
    describe = (
        f"character transformer ({cfg.n_layer} layers, {cfg.n_head} heads, width "
        f"{cfg.n_embd}, {params / 1e6:.2f}M parameters) on the built-in corpus "
        f"({len(data.train.tokens):,} training / {len(data.val.tokens):,} validation "
        f"characters, vocabulary {vocab}, context {cfg.block_size}); unigram baseline "
        f"{baseline:.3f} nats/char"
    )
    train: Any = data.train
    if cfg.stream is not None:  # read lazily, tokenized on the fly; padding is not scored
        train = char_stream(
            cfg.stream,
            data.tokenizer,
            cfg.block_size,
            reader=cfg.stream_reader,
            text_field=cfg.text_field,
        )
        describe += f"; training stream {cfg.stream} ({cfg.stream_reader})"
    return Task(
        name="charlm",
        build_model=lambda: charlm.CharTransformer(cfg, vocab),
        build_data=lambda: (train, data.val),
        loss_fn=charlm.loss_fn,
        loss_sum=cross_entropy_sum if cfg.stream is not None else None,
        loader_workers=cfg.stream_workers,
        describe=describe,
        baseline=baseline,
        tokens_per_sample=cfg.block_size,
        flops_per_token=shape.flops_per_token(),
    )


def _hf_from_options(options: Mapping[str, Any]) -> Task:
    from gpu_training.tasks.hf import hf_task  # imports transformers only when it builds

    task: Task = hf_task(options)
    return task


def _charlm_from_options(options: Mapping[str, Any]) -> Task:
    fields = list(charlm.CharLMConfig.field_names())
    for key in options:
        if key not in fields:
            raise TaskError(
                f"task 'charlm' has no option '{key}'{_suggest(key, fields)}; "
                f"options: {', '.join(fields)}"
            )
    return charlm_task(charlm.CharLMConfig(**options))


def build_task(job: JobConfig) -> Task:
    """The :class:`Task` a job names: a built-in task, a task factory, or import strings.

    Args:
        job: The job (its ``task`` section).

    Returns:
        The task; its factories run later, on every rank.

    Raises:
        TaskError: If a name or import string does not resolve (one line naming it).
    """
    spec = job.task
    if spec.model is not None and spec.data is not None:
        return task_from_imports(spec.model, spec.data, spec.loss)
    assert spec.name is not None  # TaskSpec guarantees a name or both import strings
    return resolve_task(spec.name, spec.options)


BUILTIN_TASKS: dict[str, Callable[[Mapping[str, Any]], Task]] = {
    "charlm": _charlm_from_options,
    "hf": _hf_from_options,
}
"""Built-in task name -> factory taking the task's options."""


def resolve_task(name_or_spec: str, options: Mapping[str, Any] | None = None) -> Task:
    """The task a config names: a built-in one, or a factory given as an import string.

    Args:
        name_or_spec: A built-in name (``"charlm"``) or ``"package.module:function"``, where
            ``function(**options)`` returns a :class:`Task`.
        options: For ``"charlm"``, :class:`~.charlm.CharLMConfig` fields; for ``"hf"``,
            :class:`~.hf.HFTaskOptions` fields; for an import string, the factory's keyword
            arguments.

    Returns:
        The :class:`Task`.

    Raises:
        TaskError: Unknown name (with the closest built-in), an import string that does not
            resolve (see :func:`resolve_import`), an unknown option (with the closest one),
            or a factory that does not return a Task.
        ConfigError: A built-in option with a bad value (the message names the field).
    """
    opts = dict(options or {})
    if not isinstance(name_or_spec, str):
        raise TaskError(f"task must be a name or an import string, got {name_or_spec!r}")
    if ":" in name_or_spec:
        factory = resolve_import(name_or_spec)
        _check_kwargs(name_or_spec, factory, opts)
        task = factory(**opts)
        if not isinstance(task, Task):
            raise TaskError(
                f"task factory '{name_or_spec}' returned {_a_type(task)}, expected a "
                "gpu_training.tasks.Task (for separate model and data factories use "
                "'model:' and 'data:' import strings)"
            )
        return task
    builder = BUILTIN_TASKS.get(name_or_spec.strip())
    if builder is None:
        names = sorted(BUILTIN_TASKS)
        raise TaskError(
            f"unknown task '{name_or_spec}'{_suggest(name_or_spec, names)}: use a built-in "
            f"task ({', '.join(names)}) or an import string 'package.module:function' "
            "returning a Task"
        )
    return builder(opts)


def task_checkpoint_extra(task: Task | None, model: nn.Module) -> dict[str, Any]:
    """What every checkpoint of ``task`` carries beside the weights: the task's own
    ``checkpoint_extra(model)``, else for a Hugging Face ``PreTrainedModel`` (named by import
    string) what ``ckpt export-hf`` needs, else nothing.

    Args:
        task: The run's task (None: the model alone decides).
        model: The unwrapped model.
    """
    from gpu_training.tasks.hf import checkpoint_extra, is_pretrained_model

    make = task.checkpoint_extra if task is not None else None
    if make is None and is_pretrained_model(model):  # a PreTrainedModel by import string
        make = checkpoint_extra
    return make(model) if make is not None else {}
