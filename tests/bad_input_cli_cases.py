"""Bad-input cases of fields, flags and files (see ``bad_input_table.py``): no checkpoint.

- every job field wrong in type or range, unknown fields and sections (with suggestions),
  under ``config check`` (imports nothing) and ``train`` (checks everything first), some
  under ``launch --print``; task options against the data; a global batch that does not
  split over ``--nproc``; ``--set`` syntax;
- the flags of every subcommand: bad numbers, negatives, nan / inf / 1e400 sizes, missing
  required arguments;
- files: missing, a directory, unparsable YAML or JSON, binary garbage, a list instead of a
  mapping, under every command that reads a config.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from bad_input_kit import Sandbox
from bad_input_table import argv, case, command, fragments, table, template
from dist_harness import REPO_ROOT

_DDP = REPO_ROOT / "configs" / "ddp_config.yaml"

# ----------------------------------------------------------------------------------------------
# config and job fields: `changes` is a YAML mapping of dotted fields over the tiny job

_FIELDS = table("""
lr-not-a-number              | {training.learning_rate: fast}             | training.learning_rate; number
lr-negative                  | {training.learning_rate: -0.1}             | training.learning_rate; > 0
lr-nan                       | {training.learning_rate: .nan}             | training.learning_rate; finite
lr-inf                       | {training.learning_rate: .inf}             | training.learning_rate; finite
batch-bool                   | {training.per_device_batch_size: true}     | training.per_device_batch_size; integer
batch-zero                   | {training.per_device_batch_size: 0}        | training.per_device_batch_size; >= 1
batch-float                  | {training.per_device_batch_size: 8.5}      | training.per_device_batch_size; integer
global-batch-zero            | {training.global_batch_size: 0}            | training.global_batch_size; >= 1
accum-contradicts            | {training.gradient_accumulation_steps: 3}  | gradient_accumulation_steps; contradicts
min-lr-ratio-2               | {training.min_lr_ratio: 2}                 | training.min_lr_ratio; [0, 1]
warmup-past-max-steps        | {training.warmup_steps: 10}                | training.warmup_steps; max_steps
max-steps-zero               | {training.max_steps: 0}                    | training.max_steps; >= 1
seed-negative                | {training.seed: -1}                        | training.seed; >= 0
precision-unknown            | {training.precision: fp8}                  | training.precision; bf16
precision-typo               | {training.precision: bf61}                 | training.precision; did you mean 'bf16'
training-field-typo          | {training.lerning_rate: 0.1}               | training.lerning_rate; learning_rate
section-typo                 | {checkpint.every: 2}                       | checkpint; did you mean 'checkpoint'
run-field-typo               | {run.log_evry: 5}                          | run.log_evry; did you mean 'run.log_every'
strategy-typo                | {strategy.name: dpp}                       | dpp; did you mean 'ddp'
strategy-field-typo          | {strategy.zero_stag: 2}                    | strategy.zero_stag; zero_stage
strategy-name-int            | {strategy.name: 3}                         | strategy
every-string                 | {checkpoint.every: "2"}                    | checkpoint.every; integer
keep-zero                    | {checkpoint.keep_last_n: 0}                | checkpoint.keep_last_n; >= 1
resume-not-bool              | {checkpoint.resume: "yes"}                 | checkpoint.resume; true or false
ckpt-dir-empty               | {checkpoint.dir: ""}                       | checkpoint.dir; non-empty string
eval-batches-zero            | {run.eval_batches: 0}                      | run.eval_batches; >= 1
peak-tflops-negative         | {run.peak_tflops: -1}                      | run.peak_tflops; > 0
plot-not-bool                | {run.plot: "no"}                           | run.plot; true or false
telemetry-not-bool           | {run.telemetry: "yes"}                     | run.telemetry; true or false
task-options-list            | {task_options: [1, 2]}                     | task_options; mapping
training-list                | {training: [1, 2]}                         | training; mapping
task-int                     | {task: 5}                                  | task; name or a mapping
task-model-without-data      | {task: {model: "pkg.mod:build"}}           | task.data
task-model-not-import-string | {task: {model: pkg.mod, data: "pkg.m:d"}}  | task.model; package.module:function
task-options-in-task         | {task: {name: charlm, options: {n_layer: 1}}} | task.options; task_options
""")


def _plain_job(sb: Sandbox) -> Path:
    return sb.job("plain")


def _empty_job(sb: Sandbox) -> Path:
    return sb.write("job.yaml", "# nothing here\n")


def _job_with(changes: str) -> Callable[[Sandbox], Path]:
    """The tiny job with ``changes`` (a YAML mapping of dotted fields to values)."""
    parsed = yaml.safe_load(changes)
    return lambda sb: sb.job("plain", parsed)


for _name, _changes, _expect in _FIELDS:
    _job = _job_with(_changes)
    case(
        f"config-check/{_name}",
        command("config", "check", _job),
        *fragments(_expect),
    )
    case(f"train/{_name}", command("train", _job), *fragments(_expect))
    if _name.startswith(("lr-", "batch-")):
        case(
            f"launch-print/{_name}",
            command("launch", "--print", "--nproc", "2", _job),
            *fragments(_expect),
        )

# a TrainingConfig file (fields at the top level), the other kind `config check` reads
case(
    "config-check/training-config-out-of-range",
    lambda sb: argv("config", "check", sb.write("cfg.yaml", "per_device_batch_size: 0\n")),
    "cfg.yaml",
    "per_device_batch_size",
    ">= 1",
)
case(
    "config-check/training-config-typo",
    lambda sb: argv("config", "check", sb.write("cfg.yaml", "learning_rat: 0.1\n")),
    "learning_rat",
    "did you mean 'learning_rate'",
)
case(
    "config-check/deepspeed-json-is-not-a-job",
    lambda sb: argv("config", "check", REPO_ROOT / "configs" / "deepspeed_config.json"),
    "deepspeed_config.json",
    "DeepSpeed config",
    "strategy.deepspeed_config",
)
for _label, _cmd in (
    ("config-check", ("config", "check")),
    ("train", ("train",)),
    ("launch-print", ("launch", "--print", "--nproc", "1")),
):
    case(
        f"{_label}/empty-job-file",
        command(*_cmd, _empty_job),
        "job.yaml",
        "empty",
        row="empty-job-file",
    )

# task options (and the task) are checked by `train` and `launch`; config check imports nothing
_TASKS = table("""
block-size-beyond-corpus | {task_options.block_size: 400000}                        | block_size
n-head-not-dividing      | {task_options.n_head: 3}                                 | n_head
n-layer-zero             | {task_options.n_layer: 0}                                | n_layer
option-typo              | {task_options.n_layr: 1}                                 | n_layr; did you mean 'n_layer'
task-typo                | {task: charlmm}                                          | charlmm; did you mean 'charlm'
task-import-missing      | {task: {model: "nosuchpkg.m:build", data: "nosuchpkg.m:d"}} | nosuchpkg
block-classes-typo       | {strategy.name: fsdp, strategy.block_classes: [Blok]}    | Blok
tp-not-dividing          | {strategy.name: fsdp, strategy.tensor_parallel: 4}       | strategy.tensor_parallel; does not divide the world size (2 ranks)
tp-without-fsdp          | {strategy.name: ddp, strategy.tensor_parallel: 2}        | strategy.tensor_parallel; runs under fsdp
tp-no-plan               | {task: {model: "tp_jobs:planless_model", data: "masked_task:data"}, strategy.name: fsdp, strategy.tensor_parallel: 2} | strategy.tp_plan; CharTransformer ships no tensor-parallel plan
tp-pattern-unmatched     | {strategy.name: fsdp, strategy.tensor_parallel: 2, strategy.tp_plan: {"blocks.*.mlp.fc": colwise}} | strategy.tp_plan; pattern 'blocks.*.mlp.fc' matches no module
tp-plan-style-typo       | {strategy.name: fsdp, strategy.tensor_parallel: 2, strategy.tp_plan: {"blocks.*.mlp.c_fc": colwize}} | strategy.tp_plan; did you mean 'colwise'
tp-heads-not-dividing    | {task_options.n_head: 1, strategy.name: fsdp, strategy.tensor_parallel: 2} | strategy.tensor_parallel; 2 ranks cannot split the model's 1 attention heads
""")
for _name, _changes, _expect in _TASKS:
    _row = "task-option-out-of-range" if _name == "block-size-beyond-corpus" else None
    _job = _job_with(_changes)
    case(
        f"train/{_name}",
        command("train", _job, "--nproc", "2"),
        *fragments(_expect),
        row=_row,
    )
    case(
        f"launch-print/{_name}",
        command("launch", "--print", "--nproc", "2", _job),
        *fragments(_expect),
        row=_row,
    )

# a global batch of 24 splits at 1 rank (8 x 3) but not at 2 (24 / 16)
_SPLIT_AT_1_ONLY = {"training.global_batch_size": 24, "training.per_device_batch_size": 8}
case(
    "train/global-batch-24-on-2-ranks",
    lambda sb: argv("train", sb.job("plain", _SPLIT_AT_1_ONLY), "--nproc", "2"),
    "--nproc 2",
    "global batch 24",
    row="global-batch-nproc-2",
)
case(
    "launch-print/global-batch-24-on-2-ranks",
    lambda sb: argv("launch", "--print", "--nproc", "2", sb.job("plain", _SPLIT_AT_1_ONLY)),
    "--nproc 2",
    "global batch 24",
    row="global-batch-nproc-2",
)
case(
    "launch-print/global-batch-24-on-2-nodes",
    lambda sb: argv(
        "launch",
        "--print",
        "--nproc",
        "1",
        "--nnodes",
        "2",
        "--rdzv-endpoint",
        "h:29500",
        sb.job("plain", _SPLIT_AT_1_ONLY),
    ),
    "--nproc 1 x --nnodes 2",
    "global batch 24",
    row="global-batch-nproc-2",
)
case(
    "config-check/global-batch-24-on-2-ranks",
    lambda sb: argv(
        "config", "check", sb.job("plain", _SPLIT_AT_1_ONLY), "--set", "training.world_size=2"
    ),
    "global batch 24",
    "2 ranks",
    row="global-batch-nproc-2",
)
case(
    "train/global-batch-16-on-3-ranks",
    lambda sb: argv("train", sb.job("plain"), "--nproc", "3"),
    "--nproc 3",
    "global batch 16",
    row="global-batch-nproc-2",
)

# --set syntax
_SETS = table("""
no-equals       | training.learning_rate       | training.learning_rate; key=value
no-key          | =3                           | =3; key=value
bad-yaml        | training.max_steps=[         | training.max_steps; YAML
not-a-section   | training.max_steps.x=3       | max_steps; not a section
unknown-section | trainin.max_steps=3          | trainin; did you mean 'training'
wrong-type      | training.learning_rate=fast  | training.learning_rate; with --set
""")
for _name, _text, _expect in _SETS:
    for _cmd in (("config", "check"), ("train",)):
        case(
            f"{_cmd[0]}/set-{_name}",
            command(*_cmd, _plain_job, "--set", _text),
            *fragments(_expect),
        )
case(
    "config-check/set-on-training-config",
    lambda sb: argv("config", "check", sb.write("cfg.yaml", "world_size: 2\n"), "--set", "world"),
    "--set",
    "key=value",
)


# ----------------------------------------------------------------------------------------------
# command-line flags of every subcommand: `argv` in shell words, `{name}` from _PLACES

_PLACES: dict[str, Callable[[Sandbox], object]] = {
    "job": lambda sb: sb.job("plain"),
    "script": lambda sb: sb.write("train.py", "print('hi')\n"),
    "root": lambda sb: sb.root,
    "ddp": lambda sb: _DDP,
    "csv": lambda sb: sb.write("apps.csv", "pid, used_memory\n"),
}
_P = "plan --params 7e9 --gpu-memory 80"
_FLAGS = table(f"""
train/nproc-zero                     | train {{job}} --nproc 0                      | --nproc; >= 1
train/nproc-negative                 | train {{job}} --nproc -1                     | --nproc
train/nproc-word                     | train {{job}} --nproc two                    | --nproc; 'two'
train/nproc-1e400                    | train {{job}} --nproc 1e400                  | --nproc; 1e400
train/stall-timeout-zero             | train {{job}} --stall-timeout 0              | --stall-timeout; >= 1
train/missing-config                 | train                                        | CONFIG; required
train/unknown-flag                   | train {{job}} --npoc 2                       | --npoc
config/no-action                     | config                                       | ACTION
config-check/missing-config          | config check                                 | CONFIG
config-check/num-samples-negative    | config check {{job}} --num-samples -1        | --num-samples; >= 0
config-check/num-samples-word        | config check {{job}} --num-samples many      | --num-samples; 'many'
launch/nproc-zero                    | launch --nproc 0 {{script}}                  | --nproc; >= 1
launch/max-restarts-negative         | launch --max-restarts -1 {{script}}          | --max-restarts
launch/missing-script                | launch                                       | SCRIPT_OR_CONFIG
launch/script-missing                | launch --print --nproc 1 {{root}}/nope.py    | nope.py; does not exist
launch/script-is-a-directory         | launch --print --nproc 1 {{root}}            | a directory
launch/nnodes-without-endpoint       | launch --print --nnodes 2 --nproc 1 {{script}} | --rdzv-endpoint
launch/k8s-without-gpus              | launch --k8s --image i {{script}}            | --k8s; --gpus-per-node
launch/k8s-without-image             | launch --k8s --nproc 1 {{script}}            | --image
launch/port-word                     | launch --slurm --nproc 1 --port x {{script}} | --port; 'x'
launch/restart-policy-unknown        | launch --k8s --image i --nproc 1 --restart-policy Sometimes {{script}} | Sometimes
launch/print-with-slurm              | launch --slurm --print --nproc 1 {{script}}  | --print; --slurm
launch/slurm-time-within-warning     | launch --slurm --nproc 1 --time 1 {{script}} | --time; 90 s warning; '1'
launch/slurm-gpu-request-unknown     | launch --slurm --nproc 1 --gpu-request all {{script}} | --gpu-request; 'all'
launch/gpu-request-without-slurm     | launch --nproc 1 --gpu-request none {{script}} | --gpu-request; --slurm
launch-cmd/missing-nproc             | launch-cmd train.py                          | --nproc; required
launch-cmd/nproc-zero                | launch-cmd --nproc 0 train.py                | --nproc; >= 1
launch-cmd/nnodes-zero               | launch-cmd --nproc 1 --nnodes 0 train.py     | --nnodes
launch-cmd/nnodes-without-endpoint   | launch-cmd --nproc 1 --nnodes 2 train.py     | --rdzv-endpoint
launch-cmd/rdzv-id-without-endpoint  | launch-cmd --nproc 1 --rdzv-id j train.py    | --rdzv-id; --rdzv-endpoint
launch-cmd/endpoint-without-port     | launch-cmd --nproc 1 --rdzv-endpoint host train.py | --rdzv-endpoint; host:port
launch-cmd/max-restarts-negative     | launch-cmd --nproc 1 --max-restarts -1 train.py | --max-restarts
launch-cmd/missing-script            | launch-cmd --nproc 1                         | SCRIPT
plan/gpu-memory-nan                  | plan --params 7e9 --gpu-memory nan           | --gpu-memory; 'nan'
plan/gpu-memory-inf                  | plan --params 7e9 --gpu-memory inf           | --gpu-memory; 'inf'
plan/gpu-memory-negative             | plan --params 7e9 --gpu-memory -80           | --gpu-memory
plan/gpu-memory-zero                 | plan --params 7e9 --gpu-memory 0             | --gpu-memory
plan/gpu-memory-word                 | plan --params 7e9 --gpu-memory lots          | --gpu-memory; 'lots'
plan/gpu-memory-missing              | plan --params 7e9                            | --gpu-memory; required
plan/overhead-1e400                  | {_P} --overhead 1e400GB                      | --overhead
plan/params-nan                      | plan --params nan --gpu-memory 80            | --params; 'nan'
plan/params-1e400                    | plan --params 1e400 --gpu-memory 80          | --params
plan/gpus-zero                       | {_P} --gpus 0                                | --gpus
plan/global-batch-negative           | {_P} --global-batch -1                       | --global-batch
plan/micro-batch-zero                | {_P} --micro-batch 0                         | --micro-batch
plan/safety-margin-2                 | {_P} --safety-margin 2                       | --safety-margin
plan/safety-margin-nan               | {_P} --safety-margin nan                     | --safety-margin
plan/lr-nan                          | {_P} --lr nan                                | --lr
plan/seq-zero                        | {_P} --seq 0                                 | --seq
plan/model-typo                      | plan charlmm --gpu-memory 80                 | charlmm
plan/task-option-typo                | plan charlm --gpu-memory 80 --task-option n_layr=1 | n_layr
plan/tensor-parallel-spans-nodes     | plan --layers 2 --hidden 64 --gpu-memory 80 --gpus 16 --tensor-parallel 16 | --tensor-parallel 16; never spans nodes
plan/tensor-parallel-heads           | plan --layers 2 --hidden 64 --gpu-memory 80 --gpus 8 --tensor-parallel 2 | --tensor-parallel 2; attention heads (1)
find-batch/gpu-memory-1e400          | find-batch {{ddp}} --gpu-memory 1e400        | --gpu-memory; '1e400'
find-batch/gpu-memory-nan            | find-batch {{ddp}} --gpu-memory nan          | --gpu-memory; 'nan'
find-batch/gpu-memory-inf            | find-batch {{ddp}} --gpu-memory inf          | --gpu-memory; 'inf'
find-batch/min-batch-zero            | find-batch {{ddp}} --min-batch 0             | --min-batch
find-batch/max-batch-negative        | find-batch {{ddp}} --max-batch -1            | --max-batch
find-batch/min-above-max             | find-batch {{ddp}} --gpu-memory 80 --min-batch 8 --max-batch 4 | --min-batch; --max-batch
find-batch/safety-margin-1.5         | find-batch {{ddp}} --safety-margin 1.5       | --safety-margin
find-batch/throughput-steps-negative | find-batch {{ddp}} --throughput-steps -1     | --throughput-steps
find-batch/peak-tflops-nan           | find-batch {{ddp}} --peak-tflops nan         | --peak-tflops
find-batch/gpus-zero                 | find-batch {{ddp}} --gpu-memory 80 --gpus 0  | --gpus
find-batch/missing-config            | find-batch                                   | CONFIG
monitor/interval-zero                | monitor --interval 0                         | --interval
monitor/interval-negative            | monitor --interval -1                        | --interval
monitor/interval-nan                 | monitor --interval nan                       | --interval
monitor/count-negative               | monitor --count -1                           | --count
monitor/count-word                   | monitor --count x                            | --count
monitor/replay-apps-without-replay   | monitor --replay-apps {{csv}}                | --replay-apps; --replay
watch/missing-run-dir                | watch {{root}}/nope                          | nope; does not exist
watch/no-telemetry                   | watch {{root}} --once                        | no telemetry
watch/interval-zero                  | watch {{root}} --interval 0                  | --interval
watch/steps-zero                     | watch {{root}} --steps 0                     | --steps
watch/missing-run-dir-arg            | watch                                        | RUN_DIR
ckpt/no-action                       | ckpt                                         | ACTION
ckpt-inspect/missing-dir             | ckpt inspect                                 | DIR
ckpt-verify/missing-dir              | ckpt verify                                  | DIR
ckpt-consolidate/missing-out         | ckpt consolidate {{root}}                    | OUT
lint/missing-path                    | lint {{root}}/nope.py                        | nope.py
lint/explain-unknown                 | lint --explain GT999                         | GT999
lint/format-unknown                  | lint --format xml {{script}}                 | --format; 'xml'
lint/select-unknown                  | lint --select ZZ9 {{script}}                 | --select; ZZ9
verify/nproc-zero                    | verify --nproc 0                             | --nproc
verify/rtol-negative                 | verify --rtol -1                             | --rtol
verify/batch-size-zero               | verify --batch-size 0                        | --batch-size
verify/accum-zero                    | verify --accum 0                             | --accum
verify/task-typo                     | verify --task charlmm                        | charlmm; did you mean 'charlm'
verify/option-typo                   | verify --option n_layr=1                     | n_layr; did you mean 'n_layer'
doctor/nproc-zero                    | doctor --nproc 0                             | --nproc
doctor/min-free-negative             | doctor --min-free-gib -1                     | --min-free-gib
gpu-training/no-command              |                                              | no command
gpu-training/unknown-command         | trian                                        | trian
gpu-training/unknown-flag            | --bogus                                      | --bogus
""")
for _name, _argv, _expect in _FLAGS:
    case(_name, template(_argv, _PLACES), *fragments(_expect))

case(
    "plan/gpu-memory-1e400GB",
    template("plan --params 7e9 --gpu-memory 1e400GB", _PLACES),
    "--gpu-memory",
    "1e400GB",
    row="plan-1e400",
)
case(
    "monitor/once-without-gpu",
    template("monitor --once", _PLACES),
    "no NVIDIA GPU",
    row="monitor-no-gpu",
    code=1,
    prefix="gpu-training: ",
)
case(
    "monitor/interval-inf",
    template("monitor --interval inf", _PLACES),
    "--interval",
)
case(
    "verify/timeout-zero",
    template("verify --timeout 0 --nproc 1 --option n_layer=1", _PLACES),
    "--timeout",
)
case(
    "doctor/checkpoint-dir-under-a-file",
    lambda sb: argv("doctor", "--checkpoint-dir", sb.write("afile", "x") / "ckpts"),
    "FAIL",
    "afile",
    code=1,
    stream="stdout",
)


# ----------------------------------------------------------------------------------------------
# files: missing, a directory, unparsable, binary, a list instead of a mapping


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


_BAD_FILES: dict[str, Callable[[Sandbox, str], Path]] = {
    "missing": lambda sb, suffix: sb.root / f"nope{suffix}",
    "directory": lambda sb, suffix: _mkdir(sb.root / f"adir{suffix}"),
    "unparsable": lambda sb, suffix: sb.write(
        f"bad{suffix}", '{"training": {' if suffix == ".json" else "training: [unclosed\n  x: 1\n"
    ),
    "binary": lambda sb, suffix: sb.write(f"garbage{suffix}", bytes(range(256)) * 8),
    "list": lambda sb, suffix: sb.write(
        f"list{suffix}", "[1, 2]" if suffix == ".json" else "- training\n- run\n"
    ),
}
_FILE_WORDS = {
    "missing": "no such",
    "directory": "a directory",
    "unparsable": "not valid",
    "binary": "cannot read",
    "list": "mapping",
}
_LOADERS: dict[str, tuple[str, ...]] = {
    "train": ("train", "{file}"),
    "config-check": ("config", "check", "{file}"),
    "launch-print": ("launch", "--print", "--nproc", "1", "{file}"),
    "find-batch": ("find-batch", "{file}", "--gpu-memory", "80"),
    "plan": ("plan", "{file}", "--gpu-memory", "80"),
    "verify-config": ("verify", "--config", "{file}"),
}


def _named(build: Callable[[Sandbox, str], Path], suffix: str, sb: Sandbox) -> Path:
    """The bad file ``build`` makes, which the error line must name."""
    path = build(sb, suffix)
    sb.expect(path.name)
    return path


for _loader, _args in _LOADERS.items():
    for _bad, _build in _BAD_FILES.items():
        for _suffix in (".yaml", ".json") if _bad == "unparsable" else (".yaml",):
            _word = _FILE_WORDS[_bad]
            if _loader == "launch-print" and _bad == "missing":
                _word = "does not exist"
            case(
                f"{_loader}/{_bad}{_suffix}",
                command(*(partial(_named, _build, _suffix) if a == "{file}" else a for a in _args)),
                _word,
            )

for _bad in ("missing", "directory", "binary"):
    case(
        f"monitor/replay-{_bad}",
        command("monitor", "--replay", partial(_named, _BAD_FILES[_bad], ".csv")),
    )
case(
    "monitor/replay-malformed",
    lambda sb: argv("monitor", "--once", "--replay", sb.write("gpus.csv", "index, name\nx, A\n")),
    "gpus.csv",
)


def _ds_config(content: bytes | None) -> Callable[[Sandbox], list[str]]:
    def build(sb: Sandbox) -> list[str]:
        path = sb.root / "ds.json" if content is None else sb.write("ds.json", content)
        changes: dict[str, Any] = {"strategy.deepspeed_config": str(path)}
        return argv("train", sb.job("deepspeed", changes))

    return build


case("train/deepspeed-config-missing", _ds_config(None), "ds.json", "no such")
case("train/deepspeed-config-garbage", _ds_config(b"\x00\xff{"), "ds.json")
case("train/deepspeed-config-list", _ds_config(b"[1, 2]"), "ds.json", "mapping")
