"""A throwaway SLURM cluster on this host, for the tests that submit real jobs.

:class:`SlurmCluster` starts, under one directory, a ``munged`` with its own key and socket, a
``slurmctld`` and one ``slurmd`` per node (two ``slurmd -N NAME`` on one host make a 2-node
cluster), each in the foreground so that its PID is ours; :meth:`SlurmCluster.stop` cancels
every job, stops the daemons by PID and kills what a job left (the processes whose
environment holds this cluster's ``SLURM_CONF``). No cgroups (``proctrack/linuxproc``,
``task/none``), no accounting database, no GPUs: a CPU-only partition, like this machine.

It needs Debian's ``slurmctld slurmd slurm-client munge`` (``make test`` installs them:
``.ci/install-slurm``) and root (``slurmd`` starts jobs as their user).
:func:`unavailable` says why a machine cannot run it.

Example:
    >>> with SlurmCluster(tmp_path / "slurm", nodes=2) as cluster:  # doctest: +SKIP
    ...     cluster.client("sbatch", "--wrap", "hostname")
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["SlurmCluster", "unavailable"]

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "squeue", "scancel", "srun", "sinfo")
_SBIN = ("/usr/sbin", "/sbin")
_FIELD = re.compile(r"(\w+)=(\S*)")
_SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes; slurmstepd's sockets add ~30 to the spool


def _which(program: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])
    return shutil.which(program, path=path)


def unavailable() -> str | None:
    """Why this machine cannot start a cluster (None: it can)."""
    if not sys.platform.startswith("linux"):
        return "a local SLURM cluster needs Linux"
    if os.geteuid() != 0:
        return "a local SLURM cluster needs root (slurmd starts jobs as their user)"
    missing = [p for p in (*DAEMONS, *CLIENTS) if _which(p) is None]
    if missing:
        return (
            f"SLURM is not installed ({', '.join(missing)} missing): "
            "make test installs it (.ci/install-slurm, Debian, root)"
        )
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SlurmCluster:
    """munged, slurmctld and ``nodes`` slurmd on this host, under ``root``.

    The nodes are called by this host's short name and ``localhost`` (names that resolve,
    as a job's ``MASTER_ADDR`` must); each declares ``cpus_per_node`` CPUs whatever the
    machine has (``SlurmdParameters=config_overrides``), so that several small jobs run at
    once.
    """

    def __init__(self, root: Path, *, nodes: int = 2, cpus_per_node: int = 8) -> None:
        """Lays out the cluster's files under ``root``; :meth:`start` starts it.

        Args:
            root: An empty directory of short path (sockets live under it).
            nodes: 1 or 2.
            cpus_per_node: CPUs each node declares.
        """
        if nodes not in (1, 2):
            raise ValueError(f"nodes must be 1 or 2, got {nodes}")
        self.root = root.resolve()
        if len(str(self.root / "spool" / "localhost" / "localhost_4294967294.4294967291")) > (
            _SOCKET_PATH_MAX
        ):
            raise ValueError(f"root path too long for SLURM's sockets: {self.root}")
        host = socket.gethostname().split(".")[0]
        self.nodes = [host, "localhost"][:nodes]
        self.cpus_per_node = cpus_per_node
        self.conf = self.root / "etc" / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.env["PATH"] = os.pathsep.join([self.env.get("PATH", ""), *_SBIN])
        self._daemons: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._host = host

    # --- start and stop ------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> float:
        """Starts munged, slurmctld and the slurmd, and waits until every node is idle.

        Returns:
            Seconds it took.

        Raises:
            RuntimeError: If a daemon does not come up (with the end of its log).
        """
        began = time.monotonic()
        for sub in ("etc", "run", "log", "state", "munge", *(f"spool/{n}" for n in self.nodes)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        munge = self.root / "munge"
        munge.chmod(0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = munge / "munge.sock"
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={sock}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
        )
        self._until(sock.exists, timeout, "munged made no socket")
        self.conf.write_text(self._slurm_conf(sock))
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self._until(lambda: self.client("scontrol", "ping", check=False).returncode == 0, timeout)
        for node in self.nodes:
            self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node])
        self._until(lambda: self._idle_nodes() == len(self.nodes), timeout, "nodes not idle")
        return time.monotonic() - began

    def stop(self) -> None:
        """Cancels every job, stops the daemons by PID, kills what the jobs left."""
        if any(proc.poll() is None for name, proc in self._daemons if name == "slurmctld"):
            deadline = time.monotonic() + 90  # KillWait (30 s) and slurmd's own wait
            while time.monotonic() < deadline:
                jobs = self.client("squeue", "-h", "-o", "%i", check=False).stdout.split()
                if not jobs:
                    break
                self.client("scancel", *jobs, check=False)
                time.sleep(1.0)
        for _, proc in reversed(self._daemons):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._daemons.clear()
        self._kill_leftovers()

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- clients -------------------------------------------------------------------------

    def client(
        self, *argv: str, check: bool = True, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Runs a SLURM command (``sbatch``, ``scontrol``...) against this cluster."""
        proc = subprocess.run(
            list(argv), env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=60
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields of ``job_id`` (``JobState``, ``Reason``, ``Restarts``...)."""
        out = self.client("scontrol", "show", "job", "-o", job_id).stdout
        return dict(_FIELD.findall(out))

    def wait_job(
        self, job_id: str, until: Callable[[dict[str, str]], bool], timeout: float
    ) -> dict[str, str]:
        """Polls :meth:`job` until ``until`` holds; its last fields.

        Raises:
            TimeoutError: After ``timeout`` seconds, with the job's state.
        """
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if until(fields):
                return fields
            if time.monotonic() > deadline:
                state = {k: fields.get(k) for k in ("JobState", "Reason", "Restarts", "ExitCode")}
                raise TimeoutError(f"job {job_id} after {timeout:.0f} s: {state}")
            time.sleep(0.25)

    def log(self, name: str) -> str:
        """A daemon's log (``slurmctld``, ``slurmd-NODE``, ``munged``), for a failure message."""
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # --- helpers -------------------------------------------------------------------------

    def _slurm_conf(self, munge_socket: Path) -> str:
        d = self.root
        lines = [
            "ClusterName=gt",
            # job ids, and so the script's ports (29500 + id % 1000), apart from another cluster's
            f"FirstJobId={random.randrange(1000, 1_000_000)}",
            f"SlurmctldHost={self._host}(127.0.0.1)",
            "SlurmUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # a requeued job waits cred_expire + 1 s before it may start again (default 121 s)
            f"AuthInfo=socket={munge_socket},cred_expire=5",
            f"SlurmctldPort={_free_port()}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'run'}/slurmd-%n.pid",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SchedulerParameters=bf_interval=1,sched_interval=1",  # an eligible job starts at once
            "MailProg=/bin/true",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",  # declare more CPUs than the machine has
            "KillWait=30",
            "MinJobAge=600",  # a finished job stays visible to `scontrol show job`
        ]
        for node in self.nodes:
            lines.append(
                f"NodeName={node} NodeHostname={self._host} NodeAddr=127.0.0.1 "
                f"Port={_free_port()} CPUs={self.cpus_per_node} RealMemory=4000 State=UNKNOWN"
            )
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _spawn(self, name: str, argv: Sequence[str]) -> None:
        program = _which(argv[0])
        if program is None:
            raise RuntimeError(f"{argv[0]} not found")
        out = (self.root / "log" / f"{name}.out").open("wb")
        with out:
            proc = subprocess.Popen(
                [program, *argv[1:]],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C at the terminal is for pytest
            )
        self._daemons.append((name, proc))

    def _until(self, ready: Callable[[], bool], timeout: float, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [name for name, proc in self._daemons if proc.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {name}: {self._tail(name)}" for name, _ in self._daemons)
                why = f"{dead[0]} exited" if dead else what or "timed out"
                raise RuntimeError(f"SLURM cluster did not start: {why}\n{logs}")
            time.sleep(0.1)

    def _tail(self, name: str) -> str:
        text = self.log(name) + (self.root / "log" / f"{name}.out").read_text(errors="replace")
        return text[-1500:]

    def _idle_nodes(self) -> int:
        out = self.client("sinfo", "-h", "-N", "-t", "idle", "-o", "%N", check=False).stdout
        return len(set(out.split()))

    def _kill_leftovers(self) -> None:
        """SIGKILLs the processes whose environment names this cluster (a job's, a stepd's)."""
        mark = f"SLURM_CONF={self.conf}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if mark in environ.split(b"\0"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry), signal.SIGKILL)
