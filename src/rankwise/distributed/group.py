"""Process group life cycle: ``init`` / ``finalize`` and the rank queries.

rankwise drives ``torch.distributed`` rather than replacing it: the rendezvous store is torch's
``TCPStore``, the group is ``init_process_group``. What rankwise adds is the checking around it:
configuration errors before any peer is contacted, a peer that never arrives reported by rank
within ``timeout_ms`` instead of a hang, and a clean shutdown at exit.

A world of one creates no torch process group at all: the collectives in
:mod:`rankwise.distributed.collectives` are identities there, and ``python train.py`` runs the
same script that ``rankwise launch`` runs on N ranks.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import gc
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from rankwise.distributed.config import DistributedConfig
from rankwise.distributed.errors import (
    DistributedConfigError,
    DistributedStateError,
    DistributedTimeoutError,
)

# Store keys, under a namespace of their own per rendezvous (see _namespace).
# A counter per step (see _count); "<counter>/done" is set when the count is complete.
_ARRIVED, _JOINED, _LEFT = "arrived", "joined", "left"
# Pause between attempts to reach a store that went away under a client (see _rendezvous).
_RECONNECT_SECONDS = 0.05
# How long finalize() releases the GIL after destroying the group. gloo's worker threads
# (pt_gloo_runloop) may still be destroying finished work objects, which frees Python-owned
# tensors and needs the GIL; if the interpreter is already finalising by then, the thread is
# torn down mid-destructor and the process aborts with SIGABRT ("terminate called without an
# active exception") although training succeeded.
_DRAIN_SECONDS = 0.05


@dataclasses.dataclass(frozen=True)
class _Session:
    config: DistributedConfig
    backend: str  # resolved: "gloo" or "nccl"
    owns_group: bool  # rankwise built the torch group (and so destroys it in finalize)


# The only module state rankwise keeps: what init() set up, so that get_local_rank() and
# device() can answer and finalize() knows what to tear down. torch.distributed keeps the rest.
_session: _Session | None = None
_saw_group = False  # this process has had a torch group: drain its threads before exit
_rendezvous_count = 0  # multi-rank init() calls in this process: each gets fresh store keys
_atexit_registered = False


def init(config: DistributedConfig | None = None) -> DistributedConfig:
    """Join the process group described by ``config`` (default: the environment).

    With no environment variables this is a world of one: no process group, no sockets.
    Calling it again with the same world is a no-op; with a different one it is an error.
    A group that a script built with ``torch.distributed.init_process_group`` is adopted:
    rank and world size are then torch's, and rankwise leaves destroying it to its owner
    (or to the exit hook).

    >>> import rankwise.distributed as rd
    >>> rd.init().world_size      # no RANK / WORLD_SIZE in the environment
    1
    >>> rd.finalize()
    """
    global _session
    cfg = DistributedConfig.from_environment() if config is None else config
    cfg.validate()
    if _session is not None and _session.config.world_size > 1 and not has_group():
        _session = None  # the group was destroyed behind rankwise's back: start afresh
    if _session is not None:
        active = _session.config
        if (active.rank, active.world_size) == (cfg.rank, cfg.world_size):
            return active
        raise DistributedStateError(
            f"rankwise.distributed is already initialised as rank {active.rank} of "
            f"{active.world_size}; call rankwise.distributed.finalize() before init() with "
            f"rank {cfg.rank} of {cfg.world_size}."
        )
    _register_atexit()
    if has_group():
        return _adopt(cfg, config is None)
    backend = _resolve_backend(cfg)
    if backend == "nccl":
        torch.cuda.set_device(cfg.resolved_local_rank)
    if cfg.world_size > 1:
        # One deadline for the whole rendezvous: connecting, then waiting for the others.
        deadline = time.monotonic() + cfg.timeout_ms / 1000
        store = _rendezvous(cfg, deadline)
        dist.init_process_group(
            backend=backend,
            store=store,
            rank=cfg.rank,
            world_size=cfg.world_size,
            timeout=timedelta(milliseconds=cfg.collective_timeout_ms),
        )
        _wait_until_all_joined(store, cfg)
    _session = _Session(cfg, backend, owns_group=cfg.world_size > 1)
    return cfg


def _adopt(cfg: DistributedConfig, from_environment: bool) -> DistributedConfig:
    """Take over a group built with torch directly: its rank and world size are the truth."""
    global _session
    rank, world = dist.get_rank(), dist.get_world_size()
    # A config that names a world (passed in, or RANK / WORLD_SIZE set) must agree with torch;
    # an empty environment just means "whatever torch has".
    explicit = not from_environment or cfg.world_size > 1
    if explicit and (cfg.rank, cfg.world_size) != (rank, world):
        raise DistributedStateError(
            f"torch.distributed is already initialised as rank {rank} of {world}, but rankwise "
            f"was asked for rank {cfg.rank} of {cfg.world_size}; pass the same values, or "
            "call rankwise.distributed.init() with no config to adopt torch's group."
        )
    # Without LOCAL_RANK, assume one machine: the local rank is the global one.
    local = cfg.local_rank if cfg.local_rank is not None else rank
    adopted = dataclasses.replace(cfg, rank=rank, world_size=world, local_rank=local)
    backend = str(dist.get_backend())
    if backend == "nccl":
        torch.cuda.set_device(adopted.resolved_local_rank)
    _session = _Session(adopted, backend, owns_group=False)
    return adopted


def finalize() -> None:
    """Leave the process group and wait for the backend's threads to wind down.

    Destroys the group rankwise created; a group adopted from torch is left to the script
    that built it (and destroyed by the exit hook if still alive then). Safe to call more
    than once and when :func:`init` was never called. An ``atexit`` hook registered by
    :func:`init` runs at exit too, so a script that forgets ``finalize()`` still exits 0.
    """
    global _session
    owns = _session is not None and _session.owns_group
    _session = None
    _teardown(destroy=owns)


def _teardown(destroy: bool) -> None:
    global _saw_group
    live = has_group()
    if live:
        _saw_group = True
        if destroy:
            dist.destroy_process_group()
    if _saw_group and (destroy or not live):
        gc.collect()
        time.sleep(_DRAIN_SECONDS)  # releases the GIL so gloo's threads can finish


def has_group() -> bool:
    """True when a torch process group exists in this process (rankwise's or a script's)."""
    return dist.is_available() and dist.is_initialized()


def is_initialized() -> bool:
    """True after :func:`init` (also in a world of one) or when torch's group exists."""
    return _session is not None or has_group()


def get_rank() -> int:
    """This process's global rank; 0 when not distributed."""
    if has_group():
        return dist.get_rank()
    return _session.config.rank if _session else 0


def get_world_size() -> int:
    """Number of processes in the world; 1 when not distributed."""
    if has_group():
        return dist.get_world_size()
    return _session.config.world_size if _session else 1


def get_local_rank() -> int:
    """Index of this process on its machine (its GPU index under NCCL); 0 when not distributed."""
    if _session is not None:
        return _session.config.resolved_local_rank
    if has_group():
        try:
            local = DistributedConfig.from_environment().local_rank
        except DistributedConfigError:  # the group was built from arguments, not variables
            local = None
        return dist.get_rank() if local is None else local
    return 0


def is_master() -> bool:
    """True on rank 0, the rank that logs and writes checkpoints."""
    return get_rank() == 0


def barrier() -> None:
    """Block until every rank reaches this call; a no-op in a world of one."""
    if has_group():
        dist.barrier()


def get_backend() -> str:
    """The resolved backend of the live group: ``"gloo"``, ``"nccl"``, or ``"none"``."""
    if has_group():
        return str(dist.get_backend())
    return _session.backend if _session else "none"


def device() -> torch.device:
    """The device this rank computes on: ``cuda:<local_rank>`` under NCCL, else the CPU."""
    if get_backend() == "nccl":
        return torch.device("cuda", get_local_rank())
    return torch.device("cpu")


def detect_world() -> tuple[int, int]:
    """``(rank, world_size)`` from the live group, else from the environment, else ``(0, 1)``.

    For components (datasets, samplers) that must know their shard before — or without —
    a process group, e.g. inside DataLoader workers started by torchrun.
    """
    if has_group() or _session is not None:
        return get_rank(), get_world_size()
    cfg = DistributedConfig.from_environment()
    return cfg.rank, cfg.world_size


# -- internals -------------------------------------------------------------------------------


def _resolve_backend(cfg: DistributedConfig) -> str:
    cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return select_backend(
        cfg.backend_name,
        cfg.resolved_local_rank,
        cuda_devices=cuda_devices,
        nccl_available=dist.is_available() and dist.is_nccl_available(),
        gloo_available=dist.is_available() and dist.is_gloo_available(),
    )


def select_backend(
    requested: str,
    local_rank: int,
    *,
    cuda_devices: int,
    nccl_available: bool,
    gloo_available: bool = True,
) -> str:
    """Pick the backend for ``requested`` (``auto`` / ``gloo`` / ``nccl``) on this machine.

    A pure function of what the machine has, so every error path is testable anywhere.

    >>> select_backend("auto", 0, cuda_devices=0, nccl_available=False)
    'gloo'
    >>> select_backend("auto", 1, cuda_devices=2, nccl_available=True)
    'nccl'
    """
    name = "nccl" if requested == "auto" and cuda_devices > 0 and nccl_available else requested
    if name == "auto":
        name = "gloo"
    if name == "nccl":
        if cuda_devices == 0 or not nccl_available:
            missing = "no CUDA devices" if cuda_devices == 0 else "a torch build without NCCL"
            raise DistributedConfigError(
                f"backend 'nccl' needs CUDA GPUs and NCCL, and this machine has {missing} "
                "(DISTRIBUTED_BACKEND=nccl); set DISTRIBUTED_BACKEND=gloo (or 'cpu'), or leave "
                "it at 'auto'."
            )
        if local_rank >= cuda_devices:
            raise DistributedConfigError(
                f"local_rank ({local_rank}) is beyond the {cuda_devices} visible CUDA "
                f"device(s): LOCAL_RANK must be < {cuda_devices}. Start at most "
                f"{cuda_devices} processes per machine, or check CUDA_VISIBLE_DEVICES."
            )
    if name == "gloo" and not gloo_available:
        raise DistributedConfigError(
            "this build of torch has no gloo backend (DISTRIBUTED_BACKEND=gloo); use 'nccl'."
        )
    return name


def _hosts_store(cfg: DistributedConfig) -> bool:
    # Under torchrun's shared agent store the launcher hosts the store; otherwise rank 0 does.
    return cfg.rank == 0 and not cfg.use_agent_store


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


def _check_port_free(cfg: DistributedConfig) -> None:
    if not port_is_free(cfg.master_port):
        raise DistributedConfigError(
            f"master_port ({cfg.master_port}) is already in use on this machine "
            f"(MASTER_PORT={cfg.master_port}); another job or a leftover process holds it. "
            "Pick another port, or let `rankwise launch` choose a free one."
        )


def _rendezvous(cfg: DistributedConfig, deadline: float) -> dist.Store:
    """Connect to the store and wait for every rank; returns the store the group is built on.

    Each rendezvous works in a key namespace of its own (:func:`_namespace`), so keys left in
    a store that outlives it can never let a later one through early. That happens: a script
    that re-initialises on the same port may dial rank 0 before rank 0 has closed its
    previous store. Such a client waits there, under keys no peer will set, until that store
    closes under it, and then connects again, this time to the new one.
    """
    global _rendezvous_count
    _rendezvous_count += 1
    namespace = _namespace(cfg, _rendezvous_count)
    while True:
        try:
            store = dist.PrefixStore(namespace, _connect_store(cfg, deadline))
            _wait_for_peers(store, cfg, deadline)
            return store
        except dist.DistNetworkError as exc:
            if _hosts_store(cfg) or time.monotonic() >= deadline:
                raise _unreachable(cfg, exc) from exc
            time.sleep(_RECONNECT_SECONDS)


def _namespace(cfg: DistributedConfig, count: int) -> str:
    """Store key prefix of this process's ``count``-th rendezvous.

    Every rank of a job calls ``init()`` as many times as the others, so the count agrees
    across ranks. Under torchrun's shared agent store the restart attempt is part of it too:
    the store outlives a failed attempt, whose processes are gone (their counts restart at 1),
    and a new attempt must not read the keys of the old one (gloo would dial dead peers).
    """
    attempt = f"attempt_{cfg.restart_count}/" if cfg.use_agent_store else ""
    return f"rankwise/{attempt}init_{count}"


def _unreachable(cfg: DistributedConfig, exc: Exception) -> DistributedTimeoutError:
    host = "the launcher" if cfg.use_agent_store else "rank 0"
    return DistributedTimeoutError(
        f"rank {cfg.rank} timed out after {cfg.timeout_ms / 1000:g} s connecting to the "
        f"master at {cfg.master_addr}:{cfg.master_port} ({host} hosts it): 0 of "
        f"{cfg.world_size} ranks arrived as far as this rank can tell ({exc}). Start rank 0, "
        "check MASTER_ADDR / MASTER_PORT and the firewall, or raise DISTRIBUTED_TIMEOUT_MS."
    )


def _connect_store(cfg: DistributedConfig, deadline: float) -> dist.Store:
    hosts = _hosts_store(cfg)
    if hosts:
        _check_port_free(cfg)
    timeout = timedelta(seconds=max(deadline - time.monotonic(), 0.1))
    try:
        store: dist.Store = dist.TCPStore(
            host_name=cfg.master_addr,
            port=cfg.master_port,
            world_size=cfg.world_size,
            is_master=hosts,
            timeout=timeout,
            wait_for_workers=False,
        )
    except (RuntimeError, OSError) as exc:  # DistNetworkError / DistStoreError derive from these
        if hosts:
            raise DistributedConfigError(
                f"could not listen on MASTER_PORT={cfg.master_port} ({exc}); pick another port."
            ) from exc
        if isinstance(exc, dist.DistNetworkError):
            raise  # a store closing under us: _rendezvous connects again
        raise _unreachable(cfg, exc) from exc
    return store


def _wait_for_peers(store: dist.Store, cfg: DistributedConfig, deadline: float) -> None:
    """Count arrivals in the store so a missing peer is reported by rank, not as a hang.

    Each rank also leaves a key of its own, to name the missing ones in the error.
    """
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


def _wait_until_all_joined(store: dist.Store, cfg: DistributedConfig) -> None:
    """Return from ``init()`` only once every rank has built its group, and leave the store
    in an order that strands no one.

    Building a gloo group reads the store and connects each pair of ranks, and one rank can
    finish before another. Were it to leave at once (an exit, or ``finalize()`` right away),
    it would close its end of a pair, or the store itself when it hosts it, under a peer
    still building: "Connection reset by peer" for a job that did nothing wrong (measured:
    3 of 15 three-rank launches whose rank 0 exits right after init). So every rank waits
    until all have joined, and the rank that hosts the store waits, in turn, until every
    other rank has done its last store call of ``init()``.
    """
    timeout = timedelta(milliseconds=cfg.timeout_ms)
    _count(store, _JOINED, cfg.world_size)
    try:
        store.wait([f"{_JOINED}/done"], timeout)
        if _hosts_store(cfg):
            store.wait([f"{_LEFT}/done"], timeout)
        elif not cfg.use_agent_store:  # torchrun's agent outlives us all: nobody to tell
            _count(store, _LEFT, cfg.world_size - 1)
    except dist.DistStoreError:
        joined = store.add(_JOINED, 0)
        raise DistributedTimeoutError(
            f"rank {cfg.rank} built its process group, but after another "
            f"{cfg.timeout_ms / 1000:g} s only {joined} of {cfg.world_size} ranks had (or "
            "had finished init()): a peer failed or stalled. Check the other ranks' logs, or "
            "raise DISTRIBUTED_TIMEOUT_MS."
        ) from None


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


def _finalize_at_exit() -> None:
    # At exit every group goes, adopted ones too: the interpreter is about to tear the
    # backend's threads down, and a live group is what makes that abort.
    global _session
    _session = None
    _teardown(destroy=True)


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_finalize_at_exit)
        _atexit_registered = True
