"""``rankwise launch --on-failure restart`` (the default): a front over ``torch.distributed.run``.

In this mode torchrun does the work (spawning, rendezvous, restarts, multi-node), and rankwise
only picks settings that make it reliable by default. (``--on-failure continue`` is another
matter: there rankwise replaces torchrun's agent and supervises its own processes; see
:mod:`rankwise.launch.supervisor`.) The settings:

- **Rendezvous.** torchrun's default static rendezvous (what ``--master-port`` alone gives)
  shares one TCP store between restart attempts, so a restarted attempt's gloo
  ``connectFullMesh`` can read the dead attempt's addresses ("Connection refused") or hang.
  rankwise uses the c10d rendezvous with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, which gives
  every attempt a fresh store, so ``--max-restarts`` re-rendezvouses every time.
- **Ports.** On one node with no ``--master-port``, the rendezvous listens on a port the OS
  picks (port 0), so two jobs on one machine never collide.
- **Addresses across nodes.** torchrun names a node by its hostname, which may resolve to a
  loopback address or another NIC than the one the nodes share. With ``--nnodes`` above 1,
  each node is named by the address it routes from towards the rendezvous endpoint
  (``--local-addr``; a loopback one is left to torch), and the node holding the endpoint's
  address hosts the rendezvous store (``--rdzv-conf is_host=1``, claimed by one agent only
  where several run on one machine) even where its hostname does not say so.

Everything else is torchrun's: any torchrun flag can be given and passes through unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.utils import (
    _matches_machine_hostname,
    _parse_rendezvous_config,
    parse_rendezvous_endpoint,
)
from torch.distributed.run import parse_min_max_nnodes
from torch.distributed.run import run as torchrun_run

from rankwise.distributed.environment import LAUNCHED_VAR
from rankwise.distributed.interfaces import is_local_address, is_loopback, route_source
from rankwise.distributed.rendezvous import port_is_free

__all__ = ["apply_defaults", "run_torchrun"]


def apply_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Rewrite torchrun's parsed options with rankwise's rendezvous policy (see module doc).

    An explicit ``--rdzv-backend``, ``--rdzv-endpoint`` or ``--standalone`` is respected.
    """
    explicit_rdzv = args.standalone or args.rdzv_backend is not None or bool(args.rdzv_endpoint)
    _, max_nodes = parse_min_max_nnodes(args.nnodes)
    if explicit_rdzv:
        args.rdzv_backend = args.rdzv_backend or "static"  # torchrun's own default
    else:
        args.rdzv_backend = "c10d"
        default_port = 0 if max_nodes == 1 else 29500
        port = args.master_port if args.master_port is not None else default_port
        args.rdzv_endpoint = f"{args.master_addr}:{port}"
        if args.rdzv_id == "none":
            # One node: a fresh id per launch. Several: every node must name the same run, and
            # a fixed default keeps the command identical on each.
            args.rdzv_id = str(uuid.uuid4()) if max_nodes == 1 else "rankwise"
        if max_nodes > 1 and args.node_rank is not None:
            print(
                f"rankwise launch: --node-rank {args.node_rank} is not used by the c10d "
                "rendezvous, which numbers nodes in the order they join; pass "
                "--rdzv-backend static to pin node ranks (restarts then rely on "
                "rankwise.distributed.init()'s fresh store per rendezvous).",
                file=sys.stderr,
            )
    if args.node_rank is None:
        args.node_rank = 0
    if max_nodes > 1 and args.rdzv_backend == "c10d" and args.rdzv_endpoint:
        _address_this_node(args)
    return args


def _address_this_node(args: argparse.Namespace) -> None:
    """Tell torchrun this node's address as the rendezvous host sees it (see module doc).

    torchrun names a node by its FQDN and decides whether it hosts the rendezvous store by
    comparing the endpoint with the hostname's addresses. Where the hostname resolves to a
    loopback address or another NIC, the peers are sent to ``127.0.0.1`` and no node hosts
    the store. The address the kernel routes from towards the endpoint is right on every
    node; an explicit ``--local-addr`` or ``--rdzv-conf is_host=...`` wins.
    """
    host, port = parse_rendezvous_endpoint(args.rdzv_endpoint, default_port=29400)
    if args.local_addr is None:
        source = route_source(host)
        # A loopback source (the endpoint is this node's name, mapped to 127.0.1.1) would be
        # published as every worker's MASTER_ADDR; torch's FQDN at least resolves elsewhere.
        if source is not None and not is_loopback(source):
            args.local_addr = source
    if "is_host" in _parse_rendezvous_config(args.rdzv_conf or ""):
        return
    # This node holds the endpoint's address, which torch's hostname check missed.
    local = is_local_address(host) and not _matches_machine_hostname(host)
    if local and _claim_store_host(args, host, port):
        args.rdzv_conf = ",".join(filter(None, [args.rdzv_conf, "is_host=1"]))


def _claim_store_host(args: argparse.Namespace, host: str, port: int) -> bool:
    """Whether this agent hosts ``host:port``'s store; if so, it keeps a lock on ``args``.

    With ``is_host=1`` given, torch never falls back to being a client, so of two agents
    started at once on one machine exactly one may claim it: the first to take an exclusive
    lock on a file named after the endpoint, which the OS drops when that agent exits. A busy
    port means an agent outside the lock (e.g. plain torchrun) hosts it: torch's "no" is right.
    Without ``fcntl`` (Windows) or the lock file, only the port is checked.
    """
    path = Path(tempfile.gettempdir()) / f"rankwise-rdzv-{host}-{port}.lock"
    lock: IO[bytes] | None = None
    with contextlib.suppress(OSError):  # e.g. a sticky /tmp refusing another user's file
        # Read-only is enough for flock, and opens another user's lock file too.
        lock = os.fdopen(os.open(path, os.O_RDONLY | os.O_CREAT, 0o644), "rb")
    if lock is not None:
        try:
            import fcntl  # not on Windows

            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:
            pass
        except OSError:  # another agent on this machine holds it: that one hosts
            lock.close()
            return False
    if not port_is_free(port):
        if lock is not None:
            lock.close()
        return False
    args.rankwise_host_lock = lock  # held while the agent runs: args lives as long
    return True


def run_torchrun(args: argparse.Namespace) -> int:
    """Run the job with torchrun under rankwise's defaults; return its exit code (0 when every
    rank succeeded)."""
    apply_defaults(args)
    # Read by the c10d rendezvous in this (agent) process: a fresh store per attempt.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    os.environ[LAUNCHED_VAR] = "1"  # the ranks: Ctrl-C ends them quietly (distributed.interrupt)
    try:
        with _quiet_signal_notes():
            torchrun_run(args)
    except SignalException as exc:
        # torchrun's agent already forwarded the signal to every rank (a rank writing a
        # checkpoint drains it first) and ended them; exit as a signalled process would.
        print(
            f"rankwise launch: {exc.sigval.name} received: torchrun forwarded it to every "
            "rank and ended them; exit code " + str(128 + int(exc.sigval)) + ".",
            file=sys.stderr,
        )
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        # torchrun already printed each failed rank's error; pass the first exit code on.
        codes = [f.exitcode for f in exc.failures.values()]
        first = next((c for c in codes if c and c > 0), 1)
        print(
            f"rankwise launch: {len(codes)} rank(s) failed; exit code {first}. "
            "Their errors are above, each in full from the rank it happened on.",
            file=sys.stderr,
        )
        return first
    return 0


# What torchrun's agent logs as it forwards a signal to the ranks: said once, in the launcher's
# own line (run_torchrun), instead.
_SIGNAL_NOTES = (
    "Received %s death signal, shutting down workers",
    "Sending process %s closing signal %s",
)
_AGENT_LOGGERS = (
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.multiprocessing.api",
)


class _DropSignalNotes(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in _SIGNAL_NOTES


@contextlib.contextmanager
def _quiet_signal_notes() -> Iterator[None]:
    """Without torchrun's per-rank notes of a forwarded signal (its other logs are kept)."""
    drop = _DropSignalNotes()
    loggers = [logging.getLogger(name) for name in _AGENT_LOGGERS]
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)
