"""``gpu-training lint``, ``verify`` and ``doctor``: catch the mistakes before they cost a day.

* ``lint PATH...`` — static checks of training scripts (exit 1 when something is found, 4
  when a file could not be parsed, 5 for both);
* ``verify`` — run a model and data on N ranks and check sharding, gradient sync,
  accumulation and checkpoint round-trips (exit 1 when a check fails);
* ``doctor`` — the environment as a job will see it (exit 1 on a FAIL line).

Example:
    $ gpu-training lint train.py --ignore GT010
    $ gpu-training lint --explain GT007
    $ gpu-training verify --model mypkg.models:build --data mypkg.data:build --nproc 2
    $ gpu-training doctor --nproc 8 --checkpoint-dir /shared/ckpt
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register"]

_EXIT_FOUND = 1


def _codes(text: str) -> list[str]:
    return [part for part in text.replace(" ", ",").split(",") if part]


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}") from None
    if not 0 <= value < float("inf"):  # nan fails both comparisons
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def _seconds(text: str) -> float:
    """A timeout: seconds > 0 (0 would kill the ranks before they start)."""
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text}")
    return value


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``lint``, ``verify`` and ``doctor`` to the ``gpu-training`` parser."""
    _add_lint(subparsers)
    _add_verify(subparsers)
    _add_doctor(subparsers)


# --- lint -------------------------------------------------------------------------------------


_LINT_EPILOG = """\
severities:
  bug      reported by default: a mistake that costs a run (wrong data, a hang, a corrupt
           checkpoint, wasted all-reduces)
  hygiene  only with --hygiene (or --select CODE): printing from every rank (GT008), a
           learning rate that is not scaled (GT010); shown as 'CODE [hygiene]'

exit status:
  0  every file linted, nothing found
  1  something found
  2  bad usage: no PATH, a missing path, a named file that is not Python, an unknown
     code (one 'gpu-training: error:' line; nothing linted)
  4  some file could not be read or parsed (one ERROR row each; the others were linted)
  5  both 1 and 4

The project's own modules that the files import (utils.py next to main.py, a package's
__init__.py) are read too, so helpers count for what they do."""


def _add_lint(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "lint",
        help="find distributed-training mistakes in scripts without running them",
        description=(
            "Check Python training scripts for the classic DDP/AMP/checkpoint mistakes (one "
            "rule per pitfall, GT001...). Prints 'path:line:col: CODE message (evidence)'. "
            "Silence one line with '# noqa: GT003'."
        ),
        epilog=_LINT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or directories")
    parser.add_argument(
        "--select",
        action="append",
        type=_codes,
        metavar="CODES",
        help="report only these codes or prefixes, comma-separated (e.g. GT003,GT01)",
    )
    parser.add_argument(
        "--ignore", action="append", type=_codes, metavar="CODES", help="leave these codes out"
    )
    parser.add_argument(
        "--hygiene",
        action="store_true",
        help="also report the hygiene rules (GT008 printing from every rank, GT010 LR)",
    )
    parser.add_argument(
        "--include-tests",
        action="store_true",
        help="also lint test trees found under a directory (tests/, test_*.py: skipped by "
        "default, as unit tests run one process on purpose)",
    )
    parser.add_argument(
        "--unshipped",
        action="store_true",
        help="also report code only a launch the repository does not ship reaches (a script "
        "its run scripts and README start as one `python` process, the else of a store_true "
        "switch every run script passes, an accumulation count every run leaves at 1): by "
        "default lint judges the runs the repository ships",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output")
    parser.add_argument("--explain", metavar="CODE", help="explain a rule: why, fix, guide")
    parser.add_argument("--list-rules", action="store_true", help="list the rules")
    parser.set_defaults(_run=_run_lint)


def _run_lint(args: argparse.Namespace) -> int:
    from gpu_training.cli import UsageError
    from gpu_training.diagnostics.lint import (
        LintError,
        exit_code,
        format_json,
        format_text,
        format_unresolved,
        lint_paths,
    )
    from gpu_training.diagnostics.lint.rules import RULES, explain

    if args.explain is not None:
        try:
            print(explain(args.explain))
        except KeyError:
            raise UsageError(
                f"lint --explain: unknown rule {args.explain!r}: codes are "
                f"{min(RULES)}..{max(RULES)} (see --list-rules)"
            ) from None
        return 0
    if args.list_rules:
        print(
            "\n".join(f"{r.code} {r.name:<30} {r.severity:<8} {r.message}" for r in RULES.values())
        )
        return 0
    select = None if args.select is None else [c for group in args.select for c in group]
    ignore = None if args.ignore is None else [c for group in args.ignore for c in group]
    try:
        report = lint_paths(
            args.paths,
            select=select,
            ignore=ignore,
            hygiene=args.hygiene,
            include_tests=args.include_tests,
            unshipped=args.unshipped,
        )
    except LintError as err:
        raise UsageError(f"lint: {err}") from None
    if args.format == "json":
        print(format_json(report.findings, report.errors))
    else:
        print(format_text(report.findings, report.files, report.errors))
        if report.unresolved:
            print(format_unresolved(report.unresolved))
    return exit_code(report)


# --- verify -----------------------------------------------------------------------------------


def _add_verify(subparsers: argparse._SubParsersAction[Any]) -> None:
    from gpu_training.commands.argtypes import add_set_argument, positive_int

    parser = subparsers.add_parser(
        "verify",
        help="prove sharding, gradient sync and checkpoints right on your model (N ranks)",
        description=(
            "Start N ranks and check a model and its data: sampler shards disjoint, complete "
            "and reshuffled; the same samples on every rank; identical parameters and "
            "buffers; every parameter used (unused ones named); DDP gradients equal to the "
            "single-process gradient of the concatenated batch; accumulation with no_sync "
            "equal to the big batch, one all-reduce per window; a checkpoint round-trip that "
            "reproduces the next step exactly; with a job file running tensor parallel, the "
            "data per TP group, the 2-D gradients, replicated and split parameters. The setup "
            "is the built-in task (default charlm), --model/--data import strings, or a job "
            "file (--config). Exit code 1 when a check fails. Trust: import strings and job "
            "files are code: what they name is imported and called, like a script."
        ),
    )
    source = parser.add_argument_group("what to verify (one of)")
    source.add_argument("--task", metavar="NAME", help="built-in task or pkg.mod:factory")
    source.add_argument(
        "--option",
        dest="options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a task option, VALUE parsed as YAML (repeatable), e.g. --option n_layer=1",
    )
    source.add_argument("--model", metavar="IMPORT", help="pkg.mod:fn returning an nn.Module")
    source.add_argument("--data", metavar="IMPORT", help="pkg.mod:fn returning (train, val)")
    source.add_argument(
        "--loss",
        metavar="IMPORT",
        help="pkg.mod:fn(outputs, targets) loss (default: cross-entropy of the logits, or of a "
        "model output's .logits, e.g. a Hugging Face model's)",
    )
    source.add_argument("--config", metavar="JOB", help="a job file; its task section is used")
    add_set_argument(source, "training.per_device_batch_size=4")
    parser.add_argument(
        "--nproc", type=positive_int, default=2, metavar="N", help="ranks (default 2)"
    )
    parser.add_argument(
        "--backend", choices=("auto", "gloo", "nccl"), default="auto", help="process group"
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=4, metavar="B", help="per-device micro-batch"
    )
    parser.add_argument(
        "--accum", type=positive_int, default=2, metavar="A", help="accumulation micro-steps"
    )
    parser.add_argument(
        "--sampler",
        default="global",
        metavar="KIND",
        help="'global' (the Trainer's GlobalBatchSampler), 'distributed' (DistributedSampler) "
        "or pkg.mod:fn(dataset, ctx) returning your sampler",
    )
    parser.add_argument(
        "--step",
        metavar="IMPORT",
        help="pkg.mod:fn(model, micro_batches, loss_fn): your accumulation loop to check",
    )
    parser.add_argument(
        "--rtol",
        type=_non_negative_float,
        default=1e-4,
        help="relative gradient tolerance (of max|g|)",
    )
    parser.add_argument("--atol", type=_non_negative_float, default=1e-6, help="absolute tolerance")
    parser.add_argument("--seed", type=int, default=0, help="seed for the model and batches")
    parser.add_argument(
        "--timeout", type=_seconds, default=None, metavar="S", help="kill after S s"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(_run=_run_verify)


def _run_verify(args: argparse.Namespace) -> int:
    import json

    from gpu_training.cli import UsageError
    from gpu_training.config import ConfigError, parse_override
    from gpu_training.diagnostics.verify import VerifyInputError
    from gpu_training.diagnostics.verify.launch import run_verify

    chosen = [
        name
        for name, given in (
            ("--task", args.task is not None),
            ("--model/--data", args.model is not None or args.data is not None),
            ("--config", args.config is not None),
        )
        if given
    ]
    if len(chosen) > 1:
        raise UsageError(f"verify: give one of --task, --model/--data, --config (got {chosen})")
    if args.overrides and args.config is None:
        raise UsageError("verify: --set overrides fields of --config; give --config JOB")
    if args.options and (args.model is not None or args.config is not None):
        raise UsageError("verify: --option sets options of --task; use it with --task")
    if args.loss is not None and args.model is None:
        raise UsageError("verify: --loss goes with --model and --data")
    try:
        options = dict(parse_override(text) for text in args.options)
    except ConfigError as err:
        raise UsageError(f"verify: --option: {err}") from None
    try:
        report = run_verify(
            nproc=args.nproc,
            task=args.task,
            options=options,
            model=args.model,
            data=args.data,
            loss=args.loss,
            config=args.config,
            overrides=args.overrides,
            sampler=args.sampler,
            step=args.step,
            batch_size=args.batch_size,
            accum=args.accum,
            rtol=args.rtol,
            atol=args.atol,
            seed=args.seed,
            backend=None if args.backend == "auto" else args.backend,
            timeout=args.timeout,
        )
    except VerifyInputError as err:
        raise UsageError(f"verify: {err}") from None
    except RuntimeError as err:
        print(f"gpu-training: {err}", file=sys.stderr)
        return _EXIT_FOUND
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format())
    return 0 if report.passed else _EXIT_FOUND


# --- doctor -----------------------------------------------------------------------------------


def _add_doctor(subparsers: argparse._SubParsersAction[Any]) -> None:
    from gpu_training.commands.argtypes import positive_int

    parser = subparsers.add_parser(
        "doctor",
        help="check the environment a job will see (versions, GPUs, network, disk)",
        description=(
            "Report Python, torch, CUDA, cuDNN and NCCL versions, the GPUs against "
            "CUDA_VISIBLE_DEVICES and --nproc, bf16 support, the CPU, OS and kernel, network "
            "interfaces and socket variables, this package's and its optional extras' "
            "versions, the rendezvous endpoint and free disk, each OK / WARN / FAIL with a "
            "fix, under a one-line summary to paste into a bug report. With --nnodes > 1 (run "
            "the same command on every node) a tiny torchrun job checks versions on every "
            "node and an all-reduce. Exit code 1 on a FAIL."
        ),
    )
    parser.add_argument("--nproc", type=positive_int, metavar="N", help="processes per node")
    parser.add_argument("--nnodes", type=positive_int, default=1, metavar="M", help="nodes")
    parser.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="rendezvous to check")
    parser.add_argument("--rdzv-id", metavar="ID", help="probe job id (default from endpoint)")
    parser.add_argument(
        "--checkpoint-dir",
        default="checkpoints",
        metavar="DIR",
        help="where checkpoints go (free space, writable)",
    )
    parser.add_argument(
        "--min-free-gib",
        type=_non_negative_float,
        default=10.0,
        metavar="GIB",
        help="warn below this much free disk (default 10)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=120.0,
        metavar="S",
        help="seconds for the multi-node probe (default 120)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the report as JSON (with 'environment')"
    )
    parser.set_defaults(_run=_run_doctor)


def _run_doctor(args: argparse.Namespace) -> int:
    from gpu_training.cli import UsageError
    from gpu_training.diagnostics.doctor import (
        collect_facts,
        exit_code,
        format_json,
        format_report,
        run_doctor,
    )
    from gpu_training.diagnostics.doctor.probe import probe_nodes
    from gpu_training.launcher import parse_endpoint

    if args.nnodes > 1 and args.rdzv_endpoint is None:
        raise UsageError("doctor: --nnodes > 1 needs --rdzv-endpoint HOST:PORT")
    if args.rdzv_id is not None and args.nnodes == 1:
        raise UsageError("doctor: --rdzv-id names the multi-node probe; use it with --nnodes")
    if args.rdzv_endpoint is not None:
        try:
            parse_endpoint(args.rdzv_endpoint)
        except ValueError as err:
            raise UsageError(f"doctor: --rdzv-endpoint: {err}") from None
    facts = collect_facts()
    checks = run_doctor(
        nproc=args.nproc,
        nnodes=args.nnodes,
        rdzv_endpoint=args.rdzv_endpoint,
        checkpoint_dir=args.checkpoint_dir,
        min_free_gib=args.min_free_gib,
        facts=facts,
    )
    if args.nnodes > 1:
        checks += probe_nodes(
            nnodes=args.nnodes,
            nproc=args.nproc or 1,
            rdzv_endpoint=args.rdzv_endpoint,
            rdzv_id=args.rdzv_id,
            timeout=args.timeout,
        )
    print(format_json(checks, facts) if args.json else format_report(checks, facts))
    return exit_code(checks)
