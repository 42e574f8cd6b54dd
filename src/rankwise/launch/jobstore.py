"""The job's membership store as the launchers of ``--on-failure continue`` share it.

One ``TCPStore`` per job holds the generations (:mod:`rankwise.distributed.membership`) and,
under ``launch/``, what the launchers tell each other: that training finished, each node's
exit code, each launcher's heartbeat and its claim of a ``--node-rank``; and ``auth/job``,
the job's id. The keys and their values are the contract's
(:mod:`rankwise.distributed.contract`, whose table lists every key of the store).

``launch/finished``, ``launch/done/<n>`` and ``launch/hb/<n>`` are signed with the job's secret
(:mod:`rankwise.distributed.signing`) and checked where a launcher reads them: garbage or a
stranger's value is ignored with one warning naming the key. ``rankwise store`` never holds the
secret: it reads their form only, so a store client can make it exit early (the job then stops,
naming the lost store), never crash it.

Every wait of a launcher on the others has a bound: a node whose launcher's heartbeat stood
still for ``stale_s`` (killed, its machine down) counts as gone, and the error names it and
the bound.

The store listens on the address it is given (``--master-addr``, ``rankwise store --host``,
loopback by default) only, never on every interface: torch's ``TCPStore`` binds the wildcard address, so the
listening socket is bound here and handed to it (``master_listen_fd``). The store itself is
not authenticated (as torchrun's is not): the job's secret guards who is let into the job and
every value the protocol acts on (see :mod:`rankwise.distributed.membership`), and the network
it listens on is trusted not to deny service.

Who hosts it: node 0's launcher (``--master-addr``:``--master-port``), which then stays until
every node is done (bounded); or, with ``--store-endpoint HOST:PORT``, a ``rankwise store``
running apart from the nodes, so that losing any node's launcher, node 0's included, leaves
the others their store. ``rankwise store`` serves one job and exits once its ``--nnodes``
launchers are done.
"""

from __future__ import annotations

import argparse
import re
import secrets
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from rankwise.distributed.contract import Keys
from rankwise.distributed.signing import SignedStore

__all__ = [
    "DuplicateNodeError",
    "JobStore",
    "LauncherWatch",
    "add_store_parser",
    "listen",
    "parse_endpoint",
    "serve",
]

CONNECT_S = 120.0  # a launcher started before the store host waits this long for it (default)
HEARTBEAT_S = 1.0  # every launcher bumps launch/hb/<node> this often
LAUNCHER_STALE_S = 30.0  # a launcher heartbeat still for this long: its node is gone


class DuplicateNodeError(ValueError):
    """Two launchers of one job were given the same ``--node-rank``."""


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket bound to ``host`` only (``port`` 0: one the OS picks), for
    ``TCPStore(master_listen_fd=...)``; ``OSError`` when ``host`` is not this machine's or
    the port is taken."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own listener
    try:
        sock.bind(address)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def host_store(host: str, port: int, timeout_s: float) -> tuple[dist.TCPStore, socket.socket]:
    """A ``TCPStore`` that listens on ``host`` only (see the module doc), and its socket (keep
    it as long as the store)."""
    sock = listen(host, port)
    store = dist.TCPStore(
        host, sock.getsockname()[1], is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s), master_listen_fd=sock.fileno(),
    )  # fmt: skip
    return store, sock


class LauncherWatch:
    """Which nodes' launchers stopped their heartbeat (``launch/hb/<node>``) for ``stale_s``.

    A node never seen counts from ``since`` (the watch's start) and gets ``unseen_s`` to show
    its first beat; ``since=None`` starts that clock at the first beat of any node.
    """

    def __init__(
        self, store: SignedStore, nnodes: int, stale_s: float, unseen_s: float,
        since: float | None,
    ) -> None:  # fmt: skip
        self.store, self.nnodes, self.stale_s, self.unseen_s = store, nnodes, stale_s, unseen_s
        self.since = since
        self._seen: dict[int, tuple[int, float]] = {}  # node -> (last count, when it moved)

    def gone(self, nodes: list[int]) -> list[int]:
        """Those of ``nodes`` whose launcher counts as gone now."""
        now = time.monotonic()
        for node in range(self.nnodes):
            beat = (
                self.store.get_int(Keys.launcher_heartbeat(node)) or 0
            )  # garbage: no beat (warned)
            if beat and (node not in self._seen or self._seen[node][0] != beat):
                self._seen[node] = (beat, now)
                self.since = now if self.since is None else self.since
        out = []
        for node in nodes:
            if node in self._seen:
                if now - self._seen[node][1] >= self.stale_s:
                    out.append(node)
            elif self.since is not None and now - self.since >= self.unseen_s + self.stale_s:
                out.append(node)
        return out

    def describe(self, nodes: list[int]) -> str:
        return (
            f"node(s) {nodes}: no heartbeat from their launcher for {self.stale_s:.0f} s (a "
            "launcher beats every "
            f"{HEARTBEAT_S:.0f} s; it was killed, or its machine is down or unreachable), so "
            "they count as gone"
        )


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

    def __init__(
        self, host: str, port: int, hosting: bool, node: int, nnodes: int,
        stale_s: float = LAUNCHER_STALE_S, secret: str = "", connect_s: float = CONNECT_S,
    ) -> None:  # fmt: skip
        self.host, self.node, self.nnodes, self.hosting = host, node, nnodes, hosting
        self._listener: socket.socket | None = None
        if hosting:
            self.store, self._listener = host_store(host, port, CONNECT_S)
        else:
            self.store = _client(host, port, connect_s)
        self.port = self.store.port  # the OS's choice for port 0
        self.lost = False
        self.job_id = job_id(self.store)
        # Every value a launcher acts on, signed with the job's secret (``secret``).
        self.signed = SignedStore(self.store, secret, self.job_id, who="rankwise launch")
        claim = uuid.uuid4().hex
        if self.store.compare_set(Keys.launcher_claim(node), "", claim).decode() != claim:
            raise DuplicateNodeError(
                f"another launcher of this job already runs --node-rank {node} (the store at "
                f"{host}:{self.port} holds its claim): give each node's launcher its own "
                f"--node-rank, 0 to {nnodes - 1}, and start a fresh store (a fresh "
                "--master-port, or a fresh `rankwise store`) for a new job."
            )
        self.watch = LauncherWatch(self.signed, nnodes, stale_s, connect_s, time.monotonic())
        self._stop = threading.Event()
        # The heartbeat thread's own connection.
        beats = SignedStore(_client(host, self.port, connect_s), secret, self.job_id)
        # The thread holds no reference to this handle: dropping it drops a hosted store.
        self._beating = threading.Thread(
            target=_beat, args=(beats, Keys.launcher_heartbeat(node), self._stop),
            name="rankwise-launcher-beat", daemon=True,
        )  # fmt: skip
        self._beating.start()

    def close(self) -> None:
        """Stop this launcher's heartbeat (the others then count its node gone) and wait for
        its thread: a thread left inside a store call while the process exits and the hosted
        store goes away aborts the process ("terminate called without an active exception")."""
        self._stop.set()
        self._beating.join(CONNECT_S + HEARTBEAT_S)

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
                "--host HOST --port P --nnodes N` on a machine of its own, and --store-endpoint "
                "HOST:P for "
                "every `rankwise launch`) so that losing node 0 does not stop the others.",
                file=sys.stderr,
                flush=True,
            )
            return None

    def get(self, key: str) -> str | None:
        """The signed value of ``key``, or None when it is not set, not signed with the job's
        secret (warned once per key) or the store is lost."""
        return self.call(self.signed.get, key)

    def get_int(self, key: str) -> int | None:
        """``key``'s signed whole number, or None (as :meth:`get`; garbage warned)."""
        return self.call(self.signed.get_int, key)

    def get_slots(self, key: str) -> list[int] | None:
        """``key``'s signed list of slots, or None (as :meth:`get`)."""
        return self.call(self.signed.get_slots, key)

    def set(self, key: str, value: str) -> None:
        """Write ``key``, signed (nothing, once the store is lost)."""
        self.call(self.signed.set, key, value)

    def finished(self) -> bool:
        """Whether a process of the job (on any node) finished training."""
        return self.get(Keys.LAUNCH_FINISHED) is not None

    def done_nodes(self) -> dict[int, int]:
        """The nodes whose launchers are done, with their exit codes."""
        found = {n: self.get_int(Keys.launcher_done(n)) for n in range(self.nnodes)}
        return {n: code for n, code in found.items() if code is not None}

    def await_outcome(self) -> None:
        """Wait (this node has nobody left) until training finished elsewhere or every other
        node is done or gone (its launcher's heartbeat stood still for ``stale_s``); at once
        on one node, or with the store lost."""
        while self.nnodes > 1 and not self.lost and not self.finished():
            if self._others_ended("waiting for the job's outcome"):
                return
            time.sleep(0.2)

    def await_others(self) -> None:
        """The store host: wait until every other node's launcher is done or gone."""
        while not self.lost and not self._others_ended("keeping the store for them"):
            time.sleep(0.2)

    def _others_ended(self, doing: str) -> bool:
        """Whether every other node is done or gone (the gone ones said once)."""
        waiting = sorted(set(range(self.nnodes)) - {self.node} - set(self.done_nodes()))
        if not waiting:
            return True
        gone = self.call(self.watch.gone, waiting)
        if gone is None or gone != waiting:
            return gone is None  # None: the store was lost (said)
        print(
            f"rankwise launch: {self.watch.describe(gone)}; this node stops {doing}.",
            file=sys.stderr,
            flush=True,
        )
        return True


def _beat(beats: SignedStore, key: str, stop: threading.Event) -> None:
    """A launcher's heartbeat: a new count in ``key`` every ``HEARTBEAT_S`` until ``stop``
    (written, never ``add``ed: a garbage value there must not break it)."""
    count = 0
    while True:
        count += 1
        try:
            beats.set(key, str(count))
        except Exception:  # the store is gone: the main thread finds out and says so
            return
        if stop.wait(HEARTBEAT_S):
            return


def job_id(store: dist.Store) -> str:
    """The job's id in ``store`` (``auth/job``): the first one set stays; one that is not 32
    hex digits (garbage a stranger set first) is replaced. A store client that keeps changing
    it can make the launchers disagree on it: their values then fail each other's checks (a
    denial of service, never an admission)."""
    fresh = secrets.token_hex(16)
    expected: Any = ""  # bytes where garbage is there: torch takes either
    for _ in range(50):
        got = store.compare_set(Keys.JOB_ID, expected, fresh)
        if re.fullmatch(rb"[0-9a-f]{32}", got):
            return got.decode()
        expected = got
    return fresh  # a store client keeps changing it: the launchers may disagree (a denial)


def _client(host: str, port: int, connect_s: float = CONNECT_S) -> dist.TCPStore:
    """A client of the store at ``host:port``, waiting for it at most ``connect_s`` (plus a
    connection attempt's second); ``ConnectionError`` naming the last error past that.

    torch's own client retries past its timeout (a 120 s one gave up after about 280 s), so
    the wait is made here, with plain connection attempts, and torch's client is built only
    once the port answers.
    """
    deadline = time.monotonic() + connect_s
    while True:
        left = deadline - time.monotonic()
        try:
            socket.create_connection((host, port), timeout=min(max(left, 0.1), 1.0)).close()
            break
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise ConnectionError(f"nothing answered within {connect_s:g} s: {exc}") from exc
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))
    store = dist.TCPStore(
        host, port, is_master=False, wait_for_workers=False,
        timeout=timedelta(seconds=max(deadline - time.monotonic(), 1.0)),
    )  # fmt: skip
    store.set_timeout(timedelta(seconds=CONNECT_S))  # each call's bound, once connected
    return store


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
        epilog="example: rankwise store --host 10.0.0.5 --port 29600 --nnodes 2",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on, and only there (never every interface): this "
        "machine's address on the nodes' private network (default 127.0.0.1: loopback, for "
        "nodes on this machine only)",
    )
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    parser.add_argument(
        "--nnodes", type=int, required=True, help="the job's nodes (launchers) to wait for"
    )
    parser.add_argument(
        "--launcher-stale-s",
        type=float,
        default=LAUNCHER_STALE_S,
        help="a node whose launcher's heartbeat stood still this long counts as gone (default "
        f"{LAUNCHER_STALE_S:g}); once every node is done or gone, the store exits",
    )
    return parser


def serve(args: argparse.Namespace) -> int:
    """``rankwise store``: host one job's membership store until its launchers are done."""
    if args.nnodes < 1:
        print(f"rankwise store: error: --nnodes ({args.nnodes}) must be >= 1.", file=sys.stderr)
        return 2
    if args.launcher_stale_s <= 0:
        print(
            f"rankwise store: error: --launcher-stale-s ({args.launcher_stale_s:g}) must be > 0 "
            f"seconds; e.g. --launcher-stale-s {LAUNCHER_STALE_S:g} (the default).",
            file=sys.stderr,
        )
        return 2
    try:
        store, _sock = host_store(args.host, args.port, 60)
        job_id(store)
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
    # No clock before the first launcher connects: an idle store holds nobody up.
    # Without the secret: the launchers' values are read for their form only.
    signed = SignedStore(store, None, who="rankwise store")
    watch = LauncherWatch(signed, args.nnodes, args.launcher_stale_s, CONNECT_S, None)
    try:
        while True:
            done = [
                n for n in range(args.nnodes) if signed.get_int(Keys.launcher_done(n)) is not None
            ]
            waiting = [n for n in range(args.nnodes) if n not in done]
            if not waiting:
                break
            gone = watch.gone(waiting)
            if gone == waiting:
                print(f"rankwise store: error: {watch.describe(gone)}; exiting.", file=sys.stderr)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 130
    print("rankwise store: every node's launcher is done; exiting.", file=sys.stderr)
    return 0
