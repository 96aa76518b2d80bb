"""Subcommands of ``gpu-training`` that live outside :mod:`gpu_training.cli`.

Each module defines ``register(subparsers)``; :mod:`gpu_training.cli` lists them in
``_COMMAND_MODULES``. Modules here import torch (and anything built on it) only inside the
functions that run a command, so ``gpu-training --help`` stays fast.
"""
