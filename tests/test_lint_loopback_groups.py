"""``gpu-training lint``: a process group that meets on the loopback interface is one machine's.

``GT018`` reports a GPU index taken from the global rank, which names a GPU that is not there
on a second node. A script that fixes its rendezvous to this machine's loopback
(``init_method="tcp://localhost:..."``, ``os.environ["MASTER_ADDR"] = "127.0.0.1"``, a
``tcp://localhost`` URL handed to its ``mp.spawn`` workers) cannot have a second node: every
rank is on the node and the global rank is the GPU's index, as ``mp.spawn``'s process index is.
Issue 33, set 16 (a debug script and a sweep worker that spawn on ``tcp://localhost``). A
loopback address given only as a default or in one branch is overridden by multi-node launches:
``GT018`` stays. Minimal reproductions written here, with variants.
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint.report import lint_paths

_SPAWN_LOCALHOST = """\
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(index, world_size):
    dist.init_process_group("nccl", rank=index, world_size=world_size,
                            init_method="tcp://localhost:23456")
    device = torch.device("cuda", dist.get_rank())
    x = torch.ones(1, device=device)
    dist.all_reduce(x)
    dist.destroy_process_group()


if __name__ == "__main__":
    n = torch.cuda.device_count()
    mp.spawn(worker, args=(n,), nprocs=n)
"""

_FORWARDED_URL = """\
import contextlib
import torch
import torch.distributed
from torch import multiprocessing


@contextlib.contextmanager
def distributed(**kwargs):
    torch.distributed.init_process_group(backend="nccl", **kwargs)
    try:
        torch.cuda.set_device(torch.distributed.get_rank())
        yield
    finally:
        torch.distributed.destroy_process_group()


def entry(rank, nprocs, url):
    with distributed(rank=rank, world_size=nprocs, init_method=url):
        pass


def launch(port):
    nprocs = torch.cuda.device_count()
    multiprocessing.spawn(entry, args=(nprocs, f"tcp://127.0.0.1:{port}"), nprocs=nprocs)


if __name__ == "__main__":
    launch(29500)
"""

_MASTER_ADDR = """\
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(world_size):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29500"
    dist.init_process_group("nccl", world_size=world_size)
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    return rank


def main(model):
    rank = setup(torch.cuda.device_count())
    model = DDP(model.cuda(rank), device_ids=[rank])
    dist.destroy_process_group()


if __name__ == "__main__":
    main(None)
"""

_DEFAULT_ONLY = """\
import argparse
import os
import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dist-url", default="tcp://localhost:23456")
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "localhost")
    if args.debug:
        os.environ["MASTER_ADDR"] = "localhost"
    dist.init_process_group("nccl", init_method=args.dist_url)
    torch.cuda.set_device(dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


def _gt018(tmp_path: Path, source: str) -> list[int]:
    path = tmp_path / "train.py"
    path.write_text(source)
    return sorted(f.line for f in lint_paths([path]).findings if f.code == "GT018")


def test_spawned_group_on_localhost_uses_the_rank_as_gpu(tmp_path: Path) -> None:
    """The set-16 debug script: ``mp.spawn`` workers meeting at ``tcp://localhost``."""
    assert _gt018(tmp_path, _SPAWN_LOCALHOST) == []


def test_loopback_url_handed_to_the_spawned_workers(tmp_path: Path) -> None:
    """The set-16 sweep worker: the URL travels through ``spawn``'s args and ``**kwargs``."""
    assert _gt018(tmp_path, _FORWARDED_URL) == []


def test_master_addr_fixed_to_loopback(tmp_path: Path) -> None:
    assert _gt018(tmp_path, _MASTER_ADDR) == []


def test_loopback_as_default_or_in_one_branch_proves_nothing(tmp_path: Path) -> None:
    assert _gt018(tmp_path, _DEFAULT_ONLY) == [15]
