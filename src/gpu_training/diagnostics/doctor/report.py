"""``gpu-training doctor``: the environment as this job will see it, one verdict per line.

Python, torch, CUDA, cuDNN and NCCL versions; the GPUs (name, memory, driver) against
``CUDA_VISIBLE_DEVICES`` and the intended ``--nproc``; bf16 support; the CPU, the OS and
kernel; network interfaces and the ``NCCL_*``/``GLOO_*`` socket variables; this package's
version and every optional extra's (read from the installed metadata, nothing imported); the
rendezvous endpoint; free disk where checkpoints go. Each line is ``OK``, ``WARN`` or
``FAIL`` with a fix, under a one-line summary to paste into a bug report
(:mod:`~gpu_training.diagnostics.doctor.environment`). With ``--nnodes`` and
``--rdzv-endpoint`` (run the same command on every node) it also starts a tiny ``torchrun``
job across the nodes (:mod:`~gpu_training.diagnostics.doctor.probe`) and checks that the
versions match everywhere and an all-reduce completes.

Facts are gathered by :func:`~gpu_training.diagnostics.doctor.environment.collect_facts` and
judged by :func:`judge`, a pure function, so each verdict can be tested with made-up machines.

Example:
    >>> facts = Facts(python="3.11.7", torch="2.13.0", cuda_build=None, cuda_available=False,
    ...               cpus=2, interfaces=["lo", "eth0"])
    >>> for check in judge(facts, nproc=2):
    ...     if check.name in ("torch", "gpus", "nproc"):
    ...         print(check.format())
    OK    torch       2.13.0 (CPU build)
    OK    gpus        none visible: processes use the CPU and gloo
    OK    nproc       2 CPU processes on 2 cores
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpu_training.diagnostics.doctor.environment import (
    SHOWN_VARS,
    SOCKET_VARS,
    Facts,
    collect_facts,
    environment,
    summary_line,
)

__all__ = [
    "DoctorCheck",
    "exit_code",
    "format_json",
    "format_report",
    "judge",
    "run_doctor",
    "visible_device_count",
]

OK, WARN, FAIL = "OK", "WARN", "FAIL"
_MIN_TORCH = (2, 10)


@dataclass(frozen=True)
class DoctorCheck:
    """One line of the report.

    Attributes:
        name: What was checked (``torch``, ``gpus``, ``rendezvous``...).
        status: ``OK``, ``WARN`` or ``FAIL``.
        value: What was found.
        fix: What to do about a WARN or FAIL (empty for OK).
    """

    name: str
    status: str
    value: str
    fix: str = ""

    def format(self, width: int = 11) -> str:
        """``STATUS name value`` (and ``-> fix`` on the next line), the name padded to ``width``."""
        line = f"{self.status:<5} {self.name:<{width}} {self.value}"
        return f"{line}\n{'':<{width + 7}}-> {self.fix}" if self.fix else line


def _version_tuple(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def visible_device_count(value: str | None) -> int | None:
    """How many GPUs ``CUDA_VISIBLE_DEVICES`` exposes (None: unset, all of them).

    CUDA stops at the first entry that is not a valid device (``-1`` hides everything).

    Example:
        >>> visible_device_count("0,1"), visible_device_count(""), visible_device_count("1,-1,2")
        (2, 0, 1)
        >>> visible_device_count("GPU-5f3c,GPU-77aa"), visible_device_count(None)
        (2, None)
    """
    if value is None:
        return None
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        count += 1
    return count


def _interfaces_match(spec: str, interfaces: Sequence[str]) -> list[str]:
    """The interfaces NCCL/gloo would pick for a ``*_SOCKET_IFNAME`` value.

    ``eth`` matches by prefix, ``=eth0`` exactly, ``^docker,lo`` excludes by prefix.
    """
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    names = [n.strip() for n in (body[1:] if exact else body).split(",") if n.strip()]

    def hit(iface: str) -> bool:
        return any(iface == n if exact else iface.startswith(n) for n in names)

    return [i for i in interfaces if hit(i) != exclude]


def _rendezvous(endpoint: str, timeout: float = 3.0) -> DoctorCheck:
    from gpu_training.launcher import parse_endpoint

    host, port = parse_endpoint(endpoint)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        return DoctorCheck(
            "rendezvous",
            FAIL,
            f"{endpoint}: host {host!r} does not resolve ({err.strerror})",
            "use the rank-0 node's hostname or IP as every node sees it",
        )
    local = _is_local(host, infos)
    if local:
        try:
            with socket.socket(infos[0][0], socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((infos[0][4][0], port))
            return DoctorCheck(
                "rendezvous",
                OK,
                f"{endpoint} is this machine and port {port} is free (this node hosts the "
                "rendezvous)",
            )
        except OSError:
            pass  # in use: maybe torchrun already listens there; try connecting
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return DoctorCheck("rendezvous", OK, f"{endpoint} accepts connections")
    except ConnectionRefusedError:
        if local:
            return DoctorCheck(
                "rendezvous",
                WARN,
                f"{endpoint}: port {port} is in use on this machine but refuses connections",
                "pick a free port for --rdzv-endpoint",
            )
        return DoctorCheck(
            "rendezvous",
            WARN,
            f"{endpoint}: reachable but nothing listens on port {port} yet",
            "fine before the rank-0 node starts; otherwise check the port and its firewall",
        )
    except OSError as err:
        return DoctorCheck(
            "rendezvous",
            FAIL,
            f"{endpoint}: unreachable ({err.strerror or err}) within {timeout:g}s",
            "check routing and firewalls between the nodes; NCCL hangs silently when nodes "
            "cannot talk",
        )


def _is_local(host: str, infos: Sequence[Any]) -> bool:
    addresses = {info[4][0] for info in infos}
    if any(a.startswith("127.") or a == "::1" for a in addresses):
        return True
    try:
        mine = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False
    return bool(addresses & mine)


def _disk(checkpoint_dir: str, min_free_gib: float) -> DoctorCheck:
    path = Path(checkpoint_dir).expanduser().absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    usage = shutil.disk_usage(existing)
    free = usage.free / 2**30
    where = f"{path} ({free:.1f} GiB free of {usage.total / 2**30:.0f} GiB)"
    if not existing.is_dir():  # a file in the way: mkdir of the checkpoint dir would fail
        what = "is a file" if existing == path else f"is under a file ({existing})"
        return DoctorCheck("disk", FAIL, f"{path} {what}", "point checkpoint.dir at a directory")
    if not os.access(existing, os.W_OK):
        return DoctorCheck(
            "disk", FAIL, f"{where}: {existing} is not writable", "choose a writable directory"
        )
    if free < min_free_gib:
        return DoctorCheck(
            "disk",
            WARN,
            f"{where}: less than {min_free_gib:g} GiB free",
            "free space or point checkpoint.dir elsewhere; a full disk fails a save",
        )
    return DoctorCheck("disk", OK, where)


def judge(
    facts: Facts,
    *,
    nproc: int | None = None,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    checkpoint_dir: str | None = None,
    min_free_gib: float = 10.0,
) -> list[DoctorCheck]:
    """The verdicts for ``facts`` and the intended launch.

    Args:
        facts: What the machine has (:func:`collect_facts`).
        nproc: Processes per node the job will start (None: not checked).
        nnodes: Nodes of the job.
        rdzv_endpoint: ``host:port`` to test (None: skipped).
        checkpoint_dir: Where checkpoints go (None: skipped).
        min_free_gib: Free space below which the disk line warns.

    Returns:
        The report's lines, in order.
    """
    checks: list[DoctorCheck] = []
    add = checks.append
    py = _version_tuple(facts.python)
    if py >= (3, 10):
        add(DoctorCheck("python", OK, facts.python))
    else:
        add(DoctorCheck("python", FAIL, facts.python, "use Python 3.10 or newer"))
    build = f"CUDA {facts.cuda_build} build" if facts.cuda_build else "CPU build"
    if _version_tuple(facts.torch) >= _MIN_TORCH:
        add(DoctorCheck("torch", OK, f"{facts.torch} ({build})"))
    else:
        add(
            DoctorCheck(
                "torch",
                FAIL,
                f"{facts.torch} ({build})",
                "install torch >= 2.10: older releases have checkpoint-loading CVEs "
                "(CVE-2025-32434, CVE-2026-24747)",
            )
        )
    visible = visible_device_count(facts.env.get("CUDA_VISIBLE_DEVICES"))
    if facts.cuda_build and not facts.cuda_available:
        add(
            DoctorCheck(
                "cuda",
                WARN if visible != 0 else OK,
                f"CUDA {facts.cuda_build} build, but no GPU is usable",
                "check nvidia-smi and the driver"
                if visible != 0
                else "",  # CUDA_VISIBLE_DEVICES hides them on purpose
            )
        )
    elif facts.cuda_build:
        cudnn = f", cuDNN {facts.cudnn}" if facts.cudnn else ""
        add(DoctorCheck("cuda", OK, f"CUDA {facts.cuda_build}{cudnn}"))
    else:
        add(DoctorCheck("cuda", OK, "not in this torch build: jobs run on the CPU"))
    backends = [
        b for b, ok in (("gloo", facts.gloo_available), ("nccl", facts.nccl_available)) if ok
    ]
    nccl = f"NCCL {facts.nccl}" if facts.nccl else "no NCCL"
    if facts.gpus and not facts.nccl_available:
        add(
            DoctorCheck(
                "backends",
                WARN,
                f"{', '.join(backends)}; {nccl}",
                "install a CUDA torch build with NCCL",
            )
        )
    elif not backends:
        add(DoctorCheck("backends", FAIL, "no process-group backend", "reinstall torch"))
    else:
        add(
            DoctorCheck(
                "backends",
                OK,
                f"{', '.join(backends)}" + (f" ({nccl})" if facts.cuda_build else ""),
            )
        )
    if facts.gpus:
        names = "; ".join(f"{g.index}: {g.name}, {g.memory_gib:.0f} GiB" for g in facts.gpus)
        driver = f", driver {facts.driver}" if facts.driver else ""
        add(DoctorCheck("gpus", OK, f"{len(facts.gpus)} visible ({names}){driver}"))
        kinds = {g.name for g in facts.gpus}
        if len(kinds) > 1:
            add(
                DoctorCheck(
                    "gpu mix",
                    WARN,
                    f"different GPU models: {', '.join(sorted(kinds))}",
                    "the slowest GPU sets the pace of every step; use CUDA_VISIBLE_DEVICES",
                )
            )
    else:
        add(DoctorCheck("gpus", OK, "none visible: processes use the CPU and gloo"))
    cvd = facts.env.get("CUDA_VISIBLE_DEVICES")
    if nproc is not None:
        checks.append(_nproc_check(facts, nproc, cvd))
    elif cvd is not None:
        add(DoctorCheck("visible", OK, f"CUDA_VISIBLE_DEVICES={cvd} ({visible} device(s))"))
    if facts.gpus:
        if facts.bf16:
            add(DoctorCheck("bf16", OK, "supported: use precision bf16 (no loss scaling)"))
        else:
            add(
                DoctorCheck(
                    "bf16",
                    WARN,
                    "not supported on these GPUs",
                    "use precision fp16 (GradScaler, unscale before clip); "
                    "precision: auto picks it",
                )
            )
    else:
        add(
            DoctorCheck(
                "bf16", OK, "CPU autocast supports bf16 (slow on most CPUs; fp32 is the default)"
            )
        )
    memory = f", {facts.memory_gib:.0f} GiB memory" if facts.memory_gib else ""
    of = f" of {facts.cpu_count}" if facts.cpu_count and facts.cpu_count != facts.cpus else ""
    model = f" ({facts.cpu_model})" if facts.cpu_model else ""
    add(DoctorCheck("cpu", OK, f"{facts.cpus}{of} usable core(s){model}{memory}"))
    if facts.system:
        distro = f", {facts.distro}" if facts.distro else ""
        add(DoctorCheck("os", OK, f"{facts.system} {facts.kernel} {facts.machine}{distro}"))
    checks += _network_checks(facts, nnodes)
    shown = [f"{k}={facts.env[k]}" for k in SHOWN_VARS if k in facts.env]
    add(
        DoctorCheck(
            "variables", OK, ", ".join(shown) if shown else "no NCCL_*/TORCH_* debug variables set"
        )
    )
    if facts.package:
        add(DoctorCheck("package", OK, f"gpu-training {facts.package}"))
    if facts.extras:
        found = [f"{k} {v}" for k, v in facts.extras.items() if v is not None]
        missing = [k for k, v in facts.extras.items() if v is None]
        value = ", ".join(found) if found else "none installed"
        add(
            DoctorCheck(
                "extras", OK, value + (f"; not installed: {', '.join(missing)}" if missing else "")
            )
        )
    if rdzv_endpoint is not None:
        checks.append(_rendezvous(rdzv_endpoint))
    if checkpoint_dir is not None:
        checks.append(_disk(checkpoint_dir, min_free_gib))
    return checks


def _nproc_check(facts: Facts, nproc: int, cvd: str | None) -> DoctorCheck:
    gpus = len(facts.gpus)
    shown = f"CUDA_VISIBLE_DEVICES={cvd}" if cvd is not None else "all GPUs visible"
    if gpus:
        if nproc > gpus:
            return DoctorCheck(
                "nproc",
                WARN,
                f"--nproc {nproc} but {gpus} GPU(s) visible ({shown}): local ranks "
                f"{gpus}..{nproc - 1} have no GPU of their own",
                f"use --nproc {gpus}, or widen CUDA_VISIBLE_DEVICES",
            )
        if nproc < gpus:
            return DoctorCheck(
                "nproc",
                WARN,
                f"--nproc {nproc} but {gpus} GPU(s) visible ({shown}): GPUs {nproc}..{gpus - 1} "
                "stay idle",
                f"use --nproc {gpus}, or narrow CUDA_VISIBLE_DEVICES",
            )
        return DoctorCheck("nproc", OK, f"{nproc} processes, one per visible GPU ({shown})")
    if nproc > facts.cpus:
        return DoctorCheck(
            "nproc",
            WARN,
            f"{nproc} CPU processes on {facts.cpus} core(s): oversubscribed",
            f"use --nproc {max(1, facts.cpus)} or fewer",
        )
    return DoctorCheck("nproc", OK, f"{nproc} CPU processes on {facts.cpus} cores")


def _network_checks(facts: Facts, nnodes: int) -> list[DoctorCheck]:
    checks = []
    ifaces = facts.interfaces
    external = [i for i in ifaces if i != "lo" and not i.startswith(("docker", "veth", "br-"))]
    checks.append(DoctorCheck("interfaces", OK, ", ".join(ifaces) if ifaces else "none found"))
    for var in SOCKET_VARS:
        value = facts.env.get(var)
        if value is None:
            if nnodes > 1 and len(external) > 1:
                checks.append(
                    DoctorCheck(
                        var,
                        WARN,
                        f"unset, and this host has several interfaces ({', '.join(external)})",
                        f"set {var} to the interface the nodes share (e.g. {external[0]})",
                    )
                )
            continue
        chosen = _interfaces_match(value, ifaces)
        if not chosen:
            checks.append(
                DoctorCheck(
                    var,
                    FAIL,
                    f"{value!r} matches no interface of this host ({', '.join(ifaces)})",
                    f"set {var} to one of {', '.join(ifaces)} (or unset it)",
                )
            )
        elif nnodes > 1 and all(i == "lo" for i in chosen):
            checks.append(
                DoctorCheck(
                    var,
                    FAIL,
                    f"{value!r} selects only the loopback interface for a {nnodes}-node job",
                    "name the interface the nodes reach each other on",
                )
            )
        else:
            checks.append(DoctorCheck(var, OK, f"{value!r} -> {', '.join(chosen)}"))
    return checks


def run_doctor(
    *,
    nproc: int | None = None,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    checkpoint_dir: str | None = "checkpoints",
    min_free_gib: float = 10.0,
    facts: Facts | None = None,
) -> list[DoctorCheck]:
    """:func:`collect_facts` and :func:`judge` this machine (no multi-node probe).

    Args:
        nproc: Processes per node the job will start (None: not checked).
        nnodes: Nodes of the job.
        rdzv_endpoint: ``host:port`` to test (None: skipped).
        checkpoint_dir: Where checkpoints go (None: skipped).
        min_free_gib: Free space below which the disk line warns.
        facts: Facts already collected (default: collected now).

    Example:
        >>> checks = run_doctor(checkpoint_dir=None)
        >>> [check.name for check in checks][:3]
        ['python', 'torch', 'cuda']
    """
    facts = facts if facts is not None else collect_facts()
    return judge(
        facts,
        nproc=nproc,
        nnodes=nnodes,
        rdzv_endpoint=rdzv_endpoint,
        checkpoint_dir=checkpoint_dir,
        min_free_gib=min_free_gib,
    )


def exit_code(checks: Sequence[DoctorCheck]) -> int:
    """1 if any check failed, else 0 (warnings do not fail)."""
    return 1 if any(c.status == FAIL for c in checks) else 0


def format_report(checks: Sequence[DoctorCheck], facts: Facts | None = None) -> str:
    """The report as ``gpu-training doctor`` prints it: the paste-able line (when ``facts``
    are given), the checks, and the counts."""
    counts = {s: sum(c.status == s for c in checks) for s in (OK, WARN, FAIL)}
    summary = f"{counts[OK]} OK, {counts[WARN]} WARN, {counts[FAIL]} FAIL"
    width = max((len(c.name) for c in checks), default=11)
    head = [summary_line(facts)] if facts is not None else []
    return "\n".join([*head, *(c.format(width) for c in checks), summary])


def format_json(checks: Sequence[DoctorCheck], facts: Facts | None = None) -> str:
    """``{"checks": [...], "ok": bool}`` (and ``"environment"`` with ``facts``) as JSON."""
    data: dict[str, Any] = {"checks": [asdict(c) for c in checks], "ok": not exit_code(checks)}
    if facts is not None:
        data["environment"] = environment(facts)
    return json.dumps(data, indent=2)
