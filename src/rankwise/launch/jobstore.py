"""The job's membership store as the launchers of ``--on-failure continue`` share it.

One ``TCPStore`` per job holds the generations (:mod:`rankwise.distributed.membership`) and,
under ``launch/``, what the launchers tell each other::

    launch/finished      -> "1"       (a process exited 0 somewhere: training finished)
    launch/done/<node>   -> "<code>"  (node's launcher has ended its processes; its exit code)

Who hosts it: node 0's launcher (``--master-addr``:``--master-port``), which then stays until
every node is done (bounded); or, with ``--store-endpoint HOST:PORT``, a ``rankwise store``
running apart from the nodes, so that losing any node's launcher, node 0's included, leaves
the others their store. ``rankwise store`` serves one job and exits once its ``--nnodes``
launchers are done.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

__all__ = ["JobStore", "add_store_parser", "parse_endpoint", "serve"]

CONNECT_S = 120.0  # a launcher started before the store host waits this long for it


def parse_endpoint(text: str) -> tuple[str, int] | None:
    """``"HOST:PORT"`` as ``(host, port)``, or None when it is not one.

    >>> parse_endpoint("10.0.0.5:29600"), parse_endpoint("10.0.0.5")
    (('10.0.0.5', 29600), None)
    """
    host, _, port = text.strip().rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    return host.strip("[]"), int(port)


class JobStore:
    """A launcher's handle on the job's store (hosting it, or a client of it).

    Every read and write goes through :meth:`call`: once the store is unreachable (its host
    lost) the handle says so once and answers ``None``, and the launcher goes on with its own
    processes only.
    """

    def __init__(self, host: str, port: int, hosting: bool, node: int, nnodes: int) -> None:
        self.host, self.node, self.nnodes, self.hosting = host, node, nnodes, hosting
        self.store = dist.TCPStore(
            host,
            port,
            is_master=hosting,
            wait_for_workers=False,
            timeout=timedelta(seconds=CONNECT_S),
        )
        self.port = self.store.port  # the OS's choice for port 0
        self.lost = False

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the store, or None once it is lost (said once, naming the fix)."""
        if self.lost:
            return None
        try:
            return fn(*args)
        except Exception as exc:  # the host is gone: say it once, then work without it
            self.lost = True
            print(
                f"rankwise launch: lost the membership store at {self.host}:{self.port} "
                f"({exc}): the processes of this node cannot regroup or rejoin without it and "
                "stop with its error. Host the store apart from the nodes (`rankwise store "
                "--port P --nnodes N` on a machine of its own, and --store-endpoint HOST:P for "
                "every `rankwise launch`) so that losing node 0 does not stop the others.",
                file=sys.stderr,
                flush=True,
            )
            return None

    def get(self, key: str) -> str | None:
        """The value of ``key``, or None when it is not set (or the store is lost)."""
        if not self.call(self.store.check, [key]):
            return None
        value = self.call(self.store.get, key)
        return None if value is None else value.decode()

    def set(self, key: str, value: str) -> None:
        """Write ``key`` (nothing, once the store is lost)."""
        self.call(self.store.set, key, value)

    def finished(self) -> bool:
        """Whether a process of the job (on any node) finished training."""
        return self.get("launch/finished") is not None

    def done_nodes(self) -> dict[int, int]:
        """The nodes whose launchers are done, with their exit codes."""
        found = {n: self.get(f"launch/done/{n}") for n in range(self.nnodes)}
        return {n: int(code) for n, code in found.items() if code is not None}

    def await_outcome(self) -> None:
        """Wait (this node has nobody left) until training finished elsewhere or every other
        node is done too; at once on one node, or with the store lost."""
        while self.nnodes > 1 and not self.lost and not self.finished():
            others = set(range(self.nnodes)) - {self.node}
            if others <= set(self.done_nodes()):
                return
            time.sleep(0.2)

    def await_others(self, limit_s: float) -> None:
        """The store host: wait up to ``limit_s`` for every node's launcher to be done."""
        deadline = time.monotonic() + limit_s
        while not self.lost and time.monotonic() < deadline:
            if len(self.done_nodes()) == self.nnodes:
                return
            time.sleep(0.2)
        missing = sorted(set(range(self.nnodes)) - set(self.done_nodes()))
        if missing and not self.lost:
            print(
                f"rankwise launch: node(s) {missing} did not report done within "
                f"{limit_s:.0f} s after this node's processes ended; the store goes away now "
                "and their processes lose it.",
                file=sys.stderr,
                flush=True,
            )


def add_store_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``store``: host one continue job's store apart from its nodes (:func:`serve`)."""
    parser = subparsers.add_parser(
        "store",
        help="host the membership store of one `--on-failure continue` job on its own",
        description=(
            "Serve the TCPStore that the launchers of one `rankwise launch --on-failure "
            "continue` job share (generations, joins, the job's end), on a machine of its own: "
            "pass --store-endpoint HOST:PORT to every node's launcher, node 0's included. A "
            "lost node (node 0 too) then takes only its own processes with it. Exits 0 once "
            "the --nnodes launchers are done; one store per job (start a fresh one for the "
            "next job)."
        ),
        epilog="example: rankwise store --port 29600 --nnodes 2",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    parser.add_argument(
        "--nnodes", type=int, required=True, help="the job's nodes (launchers) to wait for"
    )
    return parser


def serve(args: argparse.Namespace) -> int:
    """``rankwise store``: host one job's membership store until its launchers are done."""
    if args.nnodes < 1:
        print(f"rankwise store: error: --nnodes ({args.nnodes}) must be >= 1.", file=sys.stderr)
        return 2
    try:
        store = dist.TCPStore(
            args.host, args.port, is_master=True, wait_for_workers=False,
            timeout=timedelta(seconds=60),
        )  # fmt: skip
    except Exception as exc:
        print(
            f"rankwise store: error: cannot listen on {args.host}:{args.port} ({exc}); choose "
            "a free --port (or stop what holds it).",
            file=sys.stderr,
        )
        return 1
    print(
        f"rankwise store: serving one job's membership store on {args.host}:{store.port} for "
        f"{args.nnodes} node(s); pass --store-endpoint HOST:{store.port} to every `rankwise "
        "launch --on-failure continue` (HOST: this machine's address, as the nodes reach it).",
        file=sys.stderr,
        flush=True,
    )
    keys = [f"launch/done/{n}" for n in range(args.nnodes)]
    try:
        while not store.check(keys):
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 130
    print("rankwise store: every node's launcher is done; exiting.", file=sys.stderr)
    return 0
