"""The rendezvous store outlives every torchrun agent of a multi-node job.

A multi-node torchrun job (``--rdzv_backend=c10d``) keeps its rendezvous in a TCP store that
one agent hosts, in its own process. At the end every agent waits in an exit barrier on that
store, then closes the rendezvous through it. The host is released from the barrier as soon as
it sets the barrier's last key itself, and exits: an agent still waiting for the answer, or
closing the rendezvous a moment later, then loses the store, and prints a traceback
(``Error waiting on exit barrier ... Failed to recv, got 0 bytes``) and a warning (``failed to
shutdown the rendezvous``) at the end of a job that finished well (pytorch/pytorch#69520; seen
in ``tests/test_slurm_cluster.py`` at the normal end of a two-node run).

:class:`StoreHold` closes that window, from outside torch's agent:

* the agent that will host the store (torchrun's own rule: the rendezvous endpoint names this
  machine, or ``--rdzv_conf is_host=true``) starts the store's server before torchrun does.
  torchrun's agent shares it (``multi_tenant``), so the server lives as long as this process
  holds it, not as long as the agent does;
* every other agent, once torchrun has returned (its exit barrier passed, its rendezvous
  closed), says so in the store, and the last one marks the job left;
* the host, once its own torchrun has returned, keeps serving until that mark, at most
  :data:`LEAVE_TIMEOUT_S` seconds (an agent killed on the way out never leaves), or
  :data:`FAILED_LEAVE_TIMEOUT_S` after a failure, polling, so that a signal is handled at once.

Only a fixed node count (``--nnodes=N``, what :mod:`gpu_training.launcher` writes) is held: with
an elastic range the host cannot know how many agents to wait for, and torchrun's own ending
applies. The ``static`` rendezvous (``--master-addr``) is torchrun's own too.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported when a hold starts, not when the launcher is
    from torch.distributed import Store

__all__ = ["FAILED_LEAVE_TIMEOUT_S", "LEAVE_TIMEOUT_S", "StoreHold"]

LEAVE_TIMEOUT_S = 60.0
"""Seconds the host serves the store after its own agent ended well (or was stopped by a
signal: the other agents' workers are saving too), waiting for the others."""

FAILED_LEAVE_TIMEOUT_S = 5.0
"""The same after a failure: the job ends within seconds even where another agent's workers
hang in a collective (under ``srun --kill-on-bad-exit`` the host's exit ends them)."""

_C10D_DEFAULT_PORT = 29400  # torch's c10d rendezvous backend's
_CONNECT_TIMEOUT = timedelta(seconds=2)
_POLL_S = 0.05


class StoreHold:
    """This agent's part in keeping the rendezvous store up until every agent has left.

    Made by :meth:`start` before torchrun runs; :meth:`release` after it returned, however it
    ended. Nothing it does fails the job: a store it cannot reach is left alone.

    Args:
        host: The rendezvous endpoint's host.
        port: Its port.
        others: How many agents besides the host take part.
        run_id: The rendezvous id (``--rdzv_id``); the keys are the run's own.
        server: The store's server when this agent hosts it, else None.
    """

    def __init__(
        self, host: str, port: int, others: int, run_id: str, server: Store | None
    ) -> None:
        self.host, self.port, self.others, self.server = host, port, others, server
        self._left_key = f"gpu-training/{run_id}/agents-left"
        self._all_left_key = f"gpu-training/{run_id}/all-left"

    @property
    def hosting(self) -> bool:
        """Whether this agent serves the store."""
        return self.server is not None

    @classmethod
    def start(cls, args: argparse.Namespace) -> StoreHold | None:
        """The hold for torchrun's parsed ``args``; None where nothing needs one.

        Nothing is held for one node, an elastic node range, or a rendezvous backend other
        than ``c10d``. The host's server is started here, before torchrun's agent looks for it.
        """
        from torch.distributed.run import parse_min_max_nnodes

        endpoint = getattr(args, "rdzv_endpoint", "") or ""
        if getattr(args, "standalone", False) or args.rdzv_backend != "c10d" or not endpoint:
            return None
        try:
            low, high = parse_min_max_nnodes(str(args.nnodes))
        except (RuntimeError, ValueError):
            return None  # torchrun says what is wrong with it
        if low != high or high < 2:
            return None
        from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

        try:
            host, port = parse_rendezvous_endpoint(endpoint, default_port=_C10D_DEFAULT_PORT)
        except ValueError:
            return None
        server = _serve(host, port, _is_host(host, getattr(args, "rdzv_conf", "") or ""))
        return cls(host, port, high - 1, str(args.rdzv_id), server)

    def release(self, timeout: float = LEAVE_TIMEOUT_S) -> None:
        """Leave the store (another agent), or serve it until the others left (the host).

        Args:
            timeout: The most seconds the host waits for the others.
        """
        if self.server is None:
            self._leave()
            return
        deadline = time.monotonic() + timeout
        with contextlib.suppress(Exception):  # a signal's exception, or a store error: go
            # check() and a sleep, not wait(): a timed-out wait logs two C++ warnings, and a
            # signal is handled during a sleep, not during a wait inside the store's client
            while not self.server.check([self._all_left_key]):
                if time.monotonic() >= deadline:
                    return
                time.sleep(_POLL_S)

    def _leave(self) -> None:
        """Count this agent out; the last one out marks the job left."""
        from torch.distributed import TCPStore

        with contextlib.suppress(Exception):  # the host has gone already: nothing to keep up
            client = TCPStore(self.host, self.port, is_master=False, timeout=_CONNECT_TIMEOUT)
            if client.add(self._left_key, 1) >= self.others:
                client.set(self._all_left_key, "1")


def _is_host(host: str, rdzv_conf: str) -> bool:
    """torchrun's rule for the agent that hosts the c10d store (``is_host``, else the address).

    Both halves are torch's private helpers; a torch without them hosts nothing here, and the
    job ends as torchrun's own (its agent hosts the store, as before this hold existed).
    """
    from torch.distributed.elastic.rendezvous import utils

    parse = getattr(utils, "_parse_rendezvous_config", None)
    matches = getattr(utils, "_matches_machine_hostname", None)
    if parse is None or matches is None:
        return False
    try:
        choice = parse(rdzv_conf).get("is_host")
    except ValueError:
        return False  # torchrun refuses the configuration itself
    if choice is not None:
        return str(choice).strip().lower() in {"1", "true", "t", "yes", "y"}
    try:
        return bool(matches(host))
    except OSError:
        return False


def _serve(host: str, port: int, is_host: bool) -> Store | None:
    """The store's server at ``host:port``, shared with torchrun's agent; None if not ours.

    Two agents on one machine (a test, or two jobs' agents) both match the address: the one
    that binds first hosts, as in torchrun, and the other is a client.
    """
    if not is_host:
        return None
    from torch.distributed import TCPStore

    try:
        return TCPStore(
            host,
            port,
            is_master=True,
            multi_tenant=True,  # torchrun's agent opens the same server in this process
            wait_for_workers=False,
            timeout=_CONNECT_TIMEOUT,
        )
    except RuntimeError:  # the port is taken (another agent here hosts): a client
        return None
