"""The rendezvous store a process group is built on, and rankwise's arrival counting on it.

torch gives the store (``TCPStore``) and builds the group on it (``init_process_group``);
rankwise adds what torch's rendezvous does not promise:

- **A missing peer is named.** Every rank leaves a key of its own, and a rank that waits
  longer than ``timeout_ms`` says which ranks never arrived instead of hanging.
  (``TCPStore(wait_for_workers=True)`` counts connections only, so it cannot name them.)
- **No one leaves too early.** ``init()`` returns on no rank before every rank has built its
  group, and the store's host returns last (:func:`wait_until_all_joined`).
- **Every rendezvous has keys of its own**, so keys left in a store that outlives it can never
  let a later one through early (:func:`rendezvous`).

Who hosts the store: rank 0, always. With plain variables, SLURM or MPI it listens on
MASTER_PORT. Under torchrun's shared agent store (``TORCHELASTIC_USE_AGENT_STORE=True``) the
agent's store at MASTER_PORT serves every restart round and keeps the dead round's keys
(torch's own ``init_process_group`` on it fails restarts with gloo "Connection refused": 4 of
6 measured), and the restart count cannot tell rounds apart because each node counts its
own. So rank 0 listens on a fresh port of its own and announces it through the agent store;
a peer that reads the dead round's announcement finds nobody listening and reads again.

Module state: the count of this process's multi-rank rendezvous, which names each one's key
namespace. It is per process by nature (every rank of a job counts its own ``init()`` calls
alike), so it is a module global rather than a field of an object a caller would have to keep.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import time
import uuid
from datetime import timedelta

import torch.distributed as dist

from rankwise.distributed.config import DistributedConfig
from rankwise.distributed.errors import (
    DistributedConfigError,
    DistributedConnectionError,
    DistributedTimeoutError,
)

# A counter per step (see _count); "<counter>/done" is set when the count is complete.
_ARRIVED, _JOINED, _LEFT = "arrived", "joined", "left"
# Pause between attempts to reach a store that went away under a client.
_RECONNECT_SECONDS = 0.05
# How long a peer tries an announced store before reading the announcement again: a dead
# round's port refuses at once, so this only bounds a slow connect.
_PROBE_SECONDS = 2.0
_ID_KEY = "rankwise/store_id"

_rendezvous_count = 0  # multi-rank init() calls in this process: each gets fresh store keys


def port_is_free(port: int) -> bool:
    """Whether a TCP listener could bind ``port`` on all interfaces of this machine now.

    Same ``SO_REUSEADDR`` as the store's listener, so a port in TIME_WAIT from the last run
    counts as free.
    """
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("", port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return False
        raise
    finally:
        probe.close()
    return True


def rendezvous(cfg: DistributedConfig, deadline: float) -> dist.Store:
    """Connect to (or host) the store and wait for every rank; return the store for the group.

    Each rendezvous works in a key namespace of its own (``rankwise/init_<n>``, n counting this
    process's multi-rank ``init()`` calls, equal on every rank of a job). A script that
    re-initialises on the same port may dial rank 0 before rank 0 has closed its previous
    store: such a client waits there, under keys no peer will set, until that store closes
    under it, and then connects again, this time to the new one.
    """
    global _rendezvous_count
    _rendezvous_count += 1
    namespace = f"rankwise/init_{_rendezvous_count}"
    while True:
        try:
            if cfg.use_agent_store:
                base = _announced_store(cfg, namespace, deadline)
            else:
                base = _connect_store(cfg, cfg.master_port, deadline)
            store = dist.PrefixStore(namespace, base)
            _wait_for_peers(store, cfg, deadline)
            return store
        except dist.DistNetworkError as exc:
            if cfg.rank == 0 or time.monotonic() >= deadline:
                raise _unreachable(cfg, exc) from exc
            time.sleep(_RECONNECT_SECONDS)


def _connect_store(cfg: DistributedConfig, port: int, deadline: float) -> dist.TCPStore:
    """Rank 0 listens on ``port`` (0: one the OS picks); the others connect to it."""
    hosts = cfg.rank == 0
    if hosts and port and not port_is_free(port):
        raise DistributedConfigError(
            f"master_port ({port}) is already in use on this machine (MASTER_PORT={port}); "
            "another job or a leftover process holds it. Pick another port, or let "
            "`rankwise launch` choose a free one."
        )
    seconds = max(deadline - time.monotonic(), 0.1)
    try:
        return dist.TCPStore(
            host_name=cfg.master_addr,
            port=port,
            world_size=cfg.world_size,
            is_master=hosts,
            timeout=timedelta(seconds=seconds),
            wait_for_workers=False,  # arrivals are counted by rank, to name the missing ones
        )
    except (RuntimeError, OSError) as exc:  # DistNetworkError / DistStoreError derive from these
        if hosts:
            raise DistributedConfigError(
                f"could not listen on MASTER_PORT={port} ({exc}); pick another port, and check "
                f"that MASTER_ADDR={cfg.master_addr} is rank 0's own machine (rank 0 hosts the "
                "store there)."
            ) from exc
        if isinstance(exc, dist.DistNetworkError):
            raise  # a store closing under us, or a dead round's port: the caller tries again
        raise _unreachable(cfg, exc) from exc


def _announced_store(cfg: DistributedConfig, namespace: str, deadline: float) -> dist.Store:
    """Under torchrun's agent store: rank 0's fresh store, found through the agent's."""
    agent = _connect_agent(cfg, deadline)
    key = f"{namespace}/store"
    if cfg.rank == 0:
        own = _connect_store(cfg, 0, deadline)
        token = uuid.uuid4().hex
        own.set(_ID_KEY, token)
        agent.set(key, f"{own.port}:{token}")
        return own
    tried = ""
    while True:
        try:
            agent.wait([key], timedelta(seconds=max(deadline - time.monotonic(), 0.1)))
        except dist.DistStoreError:
            raise DistributedTimeoutError(
                f"rank {cfg.rank} timed out after {cfg.timeout_ms / 1000:g} s waiting for rank "
                f"0 to announce its store in torchrun's store at {cfg.master_addr}:"
                f"{cfg.master_port}: rank 0 did not reach init(). Check rank 0's log, or "
                "raise DISTRIBUTED_TIMEOUT_MS."
            ) from None
        announced = agent.get(key).decode()
        if announced != tried:
            tried = announced
            store = _probe(cfg, announced, deadline)
            if store is not None:
                return store
        if time.monotonic() >= deadline:
            raise _unreachable(cfg, TimeoutError(f"no live store at {announced}"))
        time.sleep(_RECONNECT_SECONDS)  # the dead round's announcement: wait for this round's


def _probe(cfg: DistributedConfig, announced: str, deadline: float) -> dist.TCPStore | None:
    """The store announced as ``"<port>:<token>"`` if it is alive and carries the token."""
    port, token = announced.split(":")
    seconds = max(min(deadline - time.monotonic(), _PROBE_SECONDS), 0.1)
    try:
        store = dist.TCPStore(
            cfg.master_addr, int(port), is_master=False, timeout=timedelta(seconds=seconds)
        )
        if store.get(_ID_KEY).decode() != token:  # another store that took the same port
            return None
    except (RuntimeError, OSError):  # nobody listens there any more: a dead round's store
        return None
    store.set_timeout(timedelta(seconds=max(deadline - time.monotonic(), 0.1)))
    return store


def _connect_agent(cfg: DistributedConfig, deadline: float) -> dist.TCPStore:
    try:
        return dist.TCPStore(
            host_name=cfg.master_addr,
            port=cfg.master_port,
            is_master=False,
            timeout=timedelta(seconds=max(deadline - time.monotonic(), 0.1)),
        )
    except (RuntimeError, OSError) as exc:
        raise _unreachable(cfg, exc) from exc


def _unreachable(cfg: DistributedConfig, exc: BaseException) -> DistributedTimeoutError:
    host = "the torchrun agent hosts it" if cfg.use_agent_store else "rank 0 hosts it"
    return DistributedTimeoutError(
        f"rank {cfg.rank} timed out after {cfg.timeout_ms / 1000:g} s connecting to the "
        f"master at {cfg.master_addr}:{cfg.master_port} ({host}): 0 of "
        f"{cfg.world_size} ranks arrived as far as this rank can tell ({exc}). Start rank 0, "
        "check MASTER_ADDR / MASTER_PORT and the firewall, or raise DISTRIBUTED_TIMEOUT_MS."
    )


def _wait_for_peers(store: dist.Store, cfg: DistributedConfig, deadline: float) -> None:
    """Count arrivals in the store so a missing peer is reported by rank, not as a hang."""
    store.set(f"{_ARRIVED}/{cfg.rank}", "1")
    _count(store, _ARRIVED, cfg.world_size)
    remaining = max(deadline - time.monotonic(), 0.1)
    try:
        store.wait([f"{_ARRIVED}/done"], timedelta(seconds=remaining))
    except dist.DistStoreError:
        arrived = store.add(_ARRIVED, 0)
        missing = [r for r in range(cfg.world_size) if not _has_key(store, f"{_ARRIVED}/{r}")]
        raise DistributedTimeoutError(
            f"timed out after {cfg.timeout_ms / 1000:g} s waiting for peers: {arrived} of "
            f"{cfg.world_size} ranks arrived at {cfg.master_addr}:{cfg.master_port} "
            f"(missing ranks: {missing}). Start every rank with the same WORLD_SIZE, "
            "MASTER_ADDR and MASTER_PORT, or raise DISTRIBUTED_TIMEOUT_MS. A script that "
            "calls init() more than once must do so the same number of times on every rank."
        ) from None


def wait_until_all_joined(store: dist.Store, cfg: DistributedConfig) -> None:
    """Return only once every rank has built its group; rank 0, the store's host, last.

    Building a gloo group reads the store and connects each pair of ranks, and one rank can
    finish before another. Were it to leave at once (an exit, or ``finalize()`` right away),
    it would close its end of a pair, or the store itself, under a peer still building:
    "Connection reset by peer" for a job that did nothing wrong (measured: 3 of 15 three-rank
    launches whose rank 0 exits right after init).
    """
    timeout = timedelta(milliseconds=cfg.timeout_ms)
    try:
        _count(store, _JOINED, cfg.world_size)
        store.wait([f"{_JOINED}/done"], timeout)
        if cfg.rank == 0:
            store.wait([f"{_LEFT}/done"], timeout)
        else:
            _count(store, _LEFT, cfg.world_size - 1)
    except dist.DistNetworkError as exc:
        raise lost_store(cfg, exc) from exc
    except dist.DistStoreError:
        joined = store.add(_JOINED, 0)
        raise DistributedTimeoutError(
            f"rank {cfg.rank} built its process group, but after another "
            f"{cfg.timeout_ms / 1000:g} s only {joined} of {cfg.world_size} ranks had (or "
            "had finished init()): a peer failed or stalled. Check the other ranks' logs, or "
            "raise DISTRIBUTED_TIMEOUT_MS."
        ) from None


def lost_store(cfg: DistributedConfig, exc: BaseException) -> DistributedConnectionError:
    """The error for a store that vanished mid-``init()``: its host, rank 0, went away."""
    return DistributedConnectionError(
        f"rank {cfg.rank} lost the rendezvous store during init(): rank 0, which hosts it at "
        f"{cfg.master_addr}, exited or crashed ({exc}). Check rank 0's log for its error; "
        "the other ranks cannot continue without it."
    )


def _count(store: dist.Store, counter: str, total: int) -> None:
    """Add one to ``counter``; the call that completes ``total`` sets ``<counter>/done``.

    One blocking request per rank for the waiters (``store.wait`` on the done key), rather
    than every rank polling the store that one of them hosts.
    """
    if store.add(counter, 1) == total:
        store.set(f"{counter}/done", "1")


def _has_key(store: dist.Store, key: str) -> bool:
    with contextlib.suppress(RuntimeError):
        return bool(store.check([key]))
    return False
