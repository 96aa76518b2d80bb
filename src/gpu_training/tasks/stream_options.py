"""The task options of a training stream: one set of names for every task that reads one.

``stream`` (a ``.jsonl``/``.txt``/``.parquet`` file or a directory of them), ``stream_reader``
(``files``: :class:`~gpu_training.tasks.streams.FileStream`; ``hf``: Hugging Face ``datasets``,
:class:`~gpu_training.tasks.streams.HFStream`), ``text_field`` (the field holding a record's
text) and ``stream_workers`` (DataLoader workers that decode the stream; not a math setting).
The built-in ``charlm`` task and ``task: hf`` take them under these names and check them here.

Example:
    >>> check_stream_options("data/", "files", 2)
    >>> check_stream_options("data/", "arrow", 0, prefix="task_options.")
    Traceback (most recent call last):
    ...
    gpu_training.config.ConfigError: field 'task_options.stream_reader': expected files or hf, got 'arrow'
"""

from __future__ import annotations

from gpu_training.config import ConfigError

__all__ = ["STREAM_READERS", "check_stream_options"]

STREAM_READERS = ("files", "hf")
"""``stream_reader`` values: the toolkit's own file reader, or Hugging Face ``datasets``."""


def check_stream_options(
    stream: object, reader: object, workers: object, *, prefix: str = ""
) -> None:
    """Check a task's stream options; one line naming the first that is wrong.

    Args:
        stream: ``stream`` (None: the task reads no stream).
        reader: ``stream_reader``.
        workers: ``stream_workers``.
        prefix: What the job file puts before an option's name (``task_options.``).

    Raises:
        ConfigError: Naming the field and what it expects.
    """

    def error(name: str, message: str) -> ConfigError:
        return ConfigError(f"field '{prefix}{name}': {message}", f"{prefix}{name}")

    if stream is not None and not (isinstance(stream, str) and stream):
        raise error("stream", f"expected a path, got {stream!r}")
    if reader not in STREAM_READERS:
        raise error("stream_reader", f"expected files or hf, got {reader!r}")
    # bool is an int subclass: `stream_workers: true` must not pass as 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise error("stream_workers", f"expected an integer >= 0, got {workers!r}")
