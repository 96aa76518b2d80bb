"""``gpu-training lint``: a flag or object derived from the node-local index is a node-local guard.

A guard on the index within the node (``local_rank``, a device id, ``is_local_main_process``)
holds on one process per node: a write under it is ``GT017`` when every node writes the same
path, never ``GT007`` ("every rank writes"). Issue 33, sets 14 and 15: the flag is often made
once and tested later, in another method:

* a ``self.print = False`` switched on under ``local_rank == 0`` in ``__init__``, tested in
  ``_save_model``;
* a ``Logger(..., enabled=(device_id == 0))`` whose methods return at once when not enabled
  (``device_id = rank % device_count``), other callers being single-GPU scripts;
* a ``Logger(log_dir if accelerator.is_local_main_process else None)`` that opens its file only
  when given a directory.

Minimal reproductions written here, with variants (DDP, FSDP, DeepSpeed, Accelerate); the same
flags switched by the *global* rank stay silent (one writer), and with no flag at all the write
is still ``GT007``.
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint.report import lint_paths

_SOLVER = """\
import torch
import torch.distributed as dist


class Solver:
    def __init__(self, args, model):
        self.args = args
        self.model = model
        self.print = False
        if (self.args.distributed and self.args.local_rank == 0) or not self.args.distributed:
            self.print = True

    def _save_model(self, path):
        if self.print:
            torch.save(self.model.state_dict(), path)

    def train(self):
        dist.init_process_group("nccl")
        self._save_model("ckpt.pt")
"""

_DEEPSPEED_SWITCH_OFF = """\
import os
import deepspeed


class Runner:
    def __init__(self, engine):
        self.engine = engine
        self.writes = True
        if int(os.environ["LOCAL_RANK"]) != 0:
            self.writes = False

    def checkpoint(self, out):
        deepspeed.init_distributed()
        if self.writes:
            with open(out + "/metrics.json", "w") as f:
                f.write("{}")
"""

_LOGGER = """\
import json
import os


class JsonlLogger:
    def __init__(self, name, log_dir, enabled=True):
        self.enabled = enabled
        self.path = f"{log_dir}/{name}.jsonl"
        os.makedirs(log_dir, exist_ok=True)

    def log(self, entry):
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\\n")
"""

_FSDP_TRAIN = """\
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from jsonl_logger import JsonlLogger


def main(model):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device_id = rank % torch.cuda.device_count()
    model = FSDP(model.to(device_id))
    logger = JsonlLogger("fsdp", "runs", enabled=(device_id == 0))
    for step in range(10):
        logger.log({"step": step})


if __name__ == "__main__":
    main(None)
"""

_SINGLE_GPU = """\
from jsonl_logger import JsonlLogger


def main():
    logger = JsonlLogger("single", "runs")
    logger.log({"step": 0})


if __name__ == "__main__":
    main()
"""

_TEE = """\
import os
import sys


class Tee:
    def __init__(self, logdir):
        self.console = sys.stdout
        if logdir is not None:
            os.makedirs(logdir, exist_ok=True)
            self.log_file = open(logdir + "/log.txt", "w")
        else:
            self.log_file = None
        sys.stdout = self
"""

_ACCELERATE_MAIN = """\
from accelerate import Accelerator

from tee import Tee

if __name__ == "__main__":
    accelerator = Accelerator()
    Tee("logs/run" if accelerator.is_local_main_process else None)
    accelerator.print("start")
"""


def _codes(root: Path, files: dict[str, str]) -> list[tuple[str, str, int]]:
    (root / ".git").mkdir()
    for name, text in files.items():
        (root / name).write_text(text)
    found = lint_paths([root]).findings
    return sorted(
        (f.code, Path(f.path).name, f.line) for f in found if f.code in ("GT007", "GT017")
    )


def test_a_flag_switched_on_under_local_rank_in_init(tmp_path: Path) -> None:
    assert _codes(tmp_path, {"solver.py": _SOLVER}) == [("GT017", "solver.py", 15)]


def test_a_flag_switched_off_on_the_other_local_ranks(tmp_path: Path) -> None:
    found = _codes(tmp_path, {"runner.py": _DEEPSPEED_SWITCH_OFF})
    assert found == [("GT017", "runner.py", 15)]


def test_the_same_switch_on_the_global_rank_is_one_writer(tmp_path: Path) -> None:
    text = _SOLVER.replace("self.args.local_rank == 0", "dist.get_rank() == 0")
    assert _codes(tmp_path, {"solver.py": text}) == []


def test_a_logger_enabled_on_device_zero(tmp_path: Path) -> None:
    files = {"jsonl_logger.py": _LOGGER, "train_fsdp.py": _FSDP_TRAIN, "single.py": _SINGLE_GPU}
    assert _codes(tmp_path, files) == [("GT017", "jsonl_logger.py", 14)]


def test_a_logger_enabled_on_global_rank_zero(tmp_path: Path) -> None:
    train = _FSDP_TRAIN.replace("enabled=(device_id == 0)", "enabled=(rank == 0)")
    assert _codes(tmp_path, {"jsonl_logger.py": _LOGGER, "train_fsdp.py": train}) == []


def test_a_logger_enabled_everywhere_is_every_rank(tmp_path: Path) -> None:
    train = _FSDP_TRAIN.replace(", enabled=(device_id == 0)", "")
    found = _codes(tmp_path, {"jsonl_logger.py": _LOGGER, "train_fsdp.py": train})
    assert ("GT007", "jsonl_logger.py", 14) in found
    assert all(code == "GT007" for code, _, _ in found)


def test_a_log_directory_given_on_the_local_main_process_only(tmp_path: Path) -> None:
    files = {"tee.py": _TEE, "main.py": _ACCELERATE_MAIN}
    assert _codes(tmp_path, files) == [("GT017", "tee.py", 10)]


def test_a_log_directory_given_on_the_main_process_only(tmp_path: Path) -> None:
    main = _ACCELERATE_MAIN.replace("is_local_main_process", "is_main_process")
    assert _codes(tmp_path, {"tee.py": _TEE, "main.py": main}) == []


_STAMPED_MAIN = """\
import os
from datetime import datetime

from accelerate import Accelerator

from tee import Tee

if __name__ == "__main__":
    log_dir = os.getcwd() + "/logs/" + {stamp}
    accelerator = Accelerator()
    Tee(log_dir if accelerator.is_local_main_process else None)
"""


def test_a_log_directory_stamped_by_each_process(tmp_path: Path) -> None:
    main = _STAMPED_MAIN.format(stamp="str(datetime.now())")
    assert _codes(tmp_path, {"tee.py": _TEE, "main.py": main}) == []


def test_a_log_directory_stamped_to_the_second(tmp_path: Path) -> None:
    main = _STAMPED_MAIN.format(stamp='datetime.now().strftime("%Y%m%d-%H%M%S")')
    assert _codes(tmp_path, {"tee.py": _TEE, "main.py": main}) == [("GT017", "tee.py", 10)]


def test_a_jsonl_name_with_the_rounded_time(tmp_path: Path) -> None:
    logger = _LOGGER.replace(
        'f"{log_dir}/{name}.jsonl"', 'f"{log_dir}/{name}_{round(time.time())}.jsonl"'
    )
    logger = "import time\n" + logger
    files = {"jsonl_logger.py": logger, "train_fsdp.py": _FSDP_TRAIN}
    assert _codes(tmp_path, files) == [("GT017", "jsonl_logger.py", 15)]
