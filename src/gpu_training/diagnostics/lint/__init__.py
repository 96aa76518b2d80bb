"""``gpu-training lint``: static checks of a training script, one rule per pitfall. No torch.

- :mod:`~gpu_training.diagnostics.lint.report` — the entry points (:func:`lint_source`,
  :func:`lint_paths`), the findings and how they are printed.
- :mod:`~gpu_training.diagnostics.lint.rules` — the rules' texts (:data:`RULES`,
  :func:`explain`).
- :mod:`~gpu_training.diagnostics.lint.run` — every check over the files of one project;
  :mod:`~gpu_training.diagnostics.lint.project` resolves names across its modules, through
  what each function does (:mod:`~gpu_training.diagnostics.lint.summary`).
- :mod:`~gpu_training.diagnostics.lint.model` — what the names of a module stand for;
  :mod:`~gpu_training.diagnostics.lint.calls` — how a call site is read;
  :mod:`~gpu_training.diagnostics.lint.guards` — rank guards, and
  :mod:`~gpu_training.diagnostics.lint.switches` — one process or a group;
  :mod:`~gpu_training.diagnostics.lint.collectives` — which calls are collectives.
- :mod:`~gpu_training.diagnostics.lint.checks` — the walk of a file, with its context
  (:mod:`~gpu_training.diagnostics.lint.context`), the whole-file rules run after it
  (:mod:`~gpu_training.diagnostics.lint.file_rules`), the set-up rules
  (:mod:`~gpu_training.diagnostics.lint.setup`; where a loader's batches go,
  :mod:`~gpu_training.diagnostics.lint.loaders`; loaders built by a helper,
  :mod:`~gpu_training.diagnostics.lint.helper_loaders`; inference-only wrappers,
  :mod:`~gpu_training.diagnostics.lint.inference`; what a save helper writes,
  :mod:`~gpu_training.diagnostics.lint.state_saves`), the rank analysis
  (:mod:`~gpu_training.diagnostics.lint.ranks`; files only rank 0 writes through,
  :mod:`~gpu_training.diagnostics.lint.handles`; Lightning's launch,
  :mod:`~gpu_training.diagnostics.lint.lightning`), the training-loop analysis
  (:mod:`~gpu_training.diagnostics.lint.training_loop`), epoch loops and ``set_epoch``
  (:mod:`~gpu_training.diagnostics.lint.epochs`; what a subclass's file takes from its base
  class's module, :mod:`~gpu_training.diagnostics.lint.class_bases`; pipeline schedules,
  :mod:`~gpu_training.diagnostics.lint.pipeline_schedules`), the process group's teardown
  (:mod:`~gpu_training.diagnostics.lint.teardown`) and bf16 parameters under Adam
  (:mod:`~gpu_training.diagnostics.lint.precision`).

The names below are those of :mod:`~gpu_training.diagnostics.lint.report` and
:mod:`~gpu_training.diagnostics.lint.rules`, importable from here.
"""

from __future__ import annotations

from gpu_training.diagnostics.lint.report import (
    EXIT_FOUND,
    EXIT_UNREADABLE,
    FileError,
    Finding,
    LintError,
    LintReport,
    collect_files,
    exit_code,
    format_json,
    format_text,
    format_unresolved,
    lint_paths,
    lint_source,
    select_rules,
)
from gpu_training.diagnostics.lint.rules import BUG, GUIDES, HYGIENE, RULES, Rule, explain

__all__ = [
    "BUG",
    "EXIT_FOUND",
    "EXIT_UNREADABLE",
    "GUIDES",
    "HYGIENE",
    "RULES",
    "FileError",
    "Finding",
    "LintError",
    "LintReport",
    "Rule",
    "collect_files",
    "exit_code",
    "explain",
    "format_json",
    "format_text",
    "format_unresolved",
    "lint_paths",
    "lint_source",
    "select_rules",
]
