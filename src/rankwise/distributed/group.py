"""Process group life cycle: ``init`` / ``finalize`` and the rank queries.

rankwise drives ``torch.distributed`` rather than replacing it: the store is torch's
``TCPStore``, the group is ``init_process_group``. What rankwise adds is the checking around it:
configuration errors before any peer is contacted, a peer that never arrives reported by rank
within ``timeout_ms`` instead of a hang (:mod:`.rendezvous`), and a clean shutdown at exit.

Only a bare ``python train.py`` (no launcher variables) runs without a torch process group:
the collectives in :mod:`rankwise.distributed.collectives` are identities there. A world of one
started by a launcher (``torchrun --nproc-per-node 1``, ``srun -n 1``) gets a real group, so the
script's own ``torch.distributed`` calls work.

Module state: this process's session (what ``init()`` set up), whether it ever had a torch
group or called ``init()`` (so the exit hook knows what to drain and destroy), and its
continue-mode :class:`~rankwise.distributed.membership.Membership`. They are module globals
because they describe the process, as torch's own default group does: one per process, read by
the free functions ``get_local_rank()``, ``device()``, ``membership()``. Other modules keep
process state of their own, each saying why in its docstring (tests/test_architecture.py
finds them): :mod:`.config.gloo` (gloo's interface
rankwise chose), :mod:`.rendezvous` (the count of rendezvous), ``augment/seeds.py`` (caches of
pure functions), and in ``train/checkpoint/`` the test fault hook (``faults.py``) and the
snapshot's refill pool (``staging.py``).
"""

from __future__ import annotations

import atexit
import dataclasses
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from rankwise.distributed.config import (
    DistributedConfig,
    MemberConfig,
    check_variables,
    choose_gloo_interface,
    restore_gloo_interface,
)
from rankwise.distributed.drain import drain, gloo_threads_alive
from rankwise.distributed.errors import DistributedConfigError, DistributedStateError
from rankwise.distributed.membership import Membership
from rankwise.distributed.rendezvous import lost_store, rendezvous, wait_until_all_joined

# With CUDA, "auto" gives torch's per-device backends: NCCL for CUDA tensors, gloo for CPU ones
# (metrics, sampler state), so a CPU tensor still reduces in a job that trains under NCCL.
CPU_AND_CUDA = "cpu:gloo,cuda:nccl"


@dataclasses.dataclass(frozen=True)
class _Session:
    config: DistributedConfig
    backend: str  # resolved: "gloo", "nccl" or "cpu:gloo,cuda:nccl"
    owns_group: bool  # rankwise built the torch group (and so destroys it in finalize)


# This module's state (the module docstring lists the other modules that keep some): what
# init() set up, so that get_local_rank() and device() can answer and finalize() knows what to
# tear down. torch.distributed keeps the rest.
_session: _Session | None = None
_saw_group = False  # this process has had a torch group: drain its threads before exit
_init_called = False  # init() ran: at exit rankwise tears down every live group (_at_exit)
_membership: Membership | None = None  # under `rankwise launch --on-failure continue`


def membership() -> Membership | None:
    """This process's :class:`~rankwise.distributed.membership.Membership` when the job runs
    under ``rankwise launch --on-failure continue`` (survivors regroup), else None."""
    return _membership


def mark_training_finished() -> None:
    """Under ``rankwise launch --on-failure continue``: record that this job's training
    finished, so that the launcher counts the processes' exit 0 as the job's end (an exit 0
    before any rank recorded it is a rank that left early, restarted like a lost one).
    ``DistributedTrainer.fit`` calls it when its last epoch is saved; a training loop of one's
    own calls it once its training is done. Nothing to do in any other mode."""
    if _membership is not None:
        _membership.record_finished()


def init(config: DistributedConfig | None = None) -> DistributedConfig:
    """Join the process group described by ``config`` (default: the environment).

    With no launcher variables this is a world of one: no process group, no sockets.
    Calling it again with the same world is a no-op; with a different one it is an error.
    A group that a script built with ``torch.distributed.init_process_group`` is adopted:
    rank and world size are then torch's, and rankwise leaves destroying it (and choosing
    its CUDA device) to its owner (or to the exit hook).

    >>> import rankwise.distributed as rd
    >>> rd.init().world_size      # no RANK / WORLD_SIZE in the environment
    1
    >>> rd.finalize()
    """
    global _session, _init_called
    check_variables()  # every RANKWISE_* / DISTRIBUTED_* setting, under plain python too
    cfg = DistributedConfig.from_environment() if config is None else config
    cfg.validate()
    if _session is not None and _session.owns_group and not has_group():
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
    _init_called = True
    if has_group():
        return _adopt(cfg, config is None)
    backend = _resolve_backend(cfg)
    needs_group = cfg.world_size > 1 or cfg.launched
    if needs_group:
        _build_group(cfg, backend, group_device(backend, cfg.resolved_local_rank))
    _session = _Session(cfg, backend, owns_group=needs_group)
    return cfg


def _build_group(cfg: DistributedConfig, backend: str, device: torch.device | None) -> None:
    if device is not None:
        torch.cuda.set_device(device)  # rankwise's own group: this rank's GPU is its local rank
    timeout = timedelta(milliseconds=cfg.collective_timeout_ms)
    if "gloo" in backend and cfg.world_size > 1:  # every generation's group binds to it too
        choose_gloo_interface(cfg.master_addr, cfg.world_size)
    if (member := MemberConfig.from_environment()) is not None:  # --on-failure continue
        global _membership
        member = dataclasses.replace(member, collective_timeout_s=timeout.total_seconds())
        _membership = Membership(member, timeout_s=cfg.timeout_ms / 1000 + 60)
        _membership.start()
        return
    if cfg.world_size == 1:  # nobody to meet: an in-process store, no port
        dist.init_process_group(
            backend,
            store=dist.HashStore(),
            rank=0,
            world_size=1,
            timeout=timeout,
            device_id=device,
        )
        return
    # One deadline for the whole rendezvous: connecting, then waiting for the others.
    store = rendezvous(cfg, time.monotonic() + cfg.timeout_ms / 1000)
    try:
        # device_id builds the NCCL communicator now, so "every rank joined" covers it too.
        dist.init_process_group(
            backend=backend,
            store=store,
            rank=cfg.rank,
            world_size=cfg.world_size,
            timeout=timeout,
            device_id=device,
        )
    except dist.DistNetworkError as exc:
        raise lost_store(cfg, exc) from exc
    wait_until_all_joined(store, cfg)


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
    backend = str(dist.get_backend())
    local = adopted_local_rank(backend, cfg.local_rank, _current_cuda_device(backend))
    adopted = dataclasses.replace(cfg, rank=rank, world_size=world, local_rank=local)
    # The script chose its CUDA device (or not) when it built the group: rankwise leaves it.
    _session = _Session(adopted, backend, owns_group=False)
    return adopted


def adopted_local_rank(
    backend: str, env_local_rank: int | None, cuda_device: int | None
) -> int | None:
    """The local rank of a group a script built with torch itself (never its global rank).

    Under NCCL the script chose its GPU before building the group: ``cuda_device``
    (``torch.cuda.current_device()``) is the local rank. Otherwise it is the launcher's
    variable (``env_local_rank``), or ``None`` (unknown) when none was set: on the second
    machine global rank 4 may be GPU 0, so the global rank is no stand-in.

    >>> adopted_local_rank("nccl", env_local_rank=4, cuda_device=0)
    0
    >>> adopted_local_rank("gloo", env_local_rank=1, cuda_device=None)
    1
    >>> adopted_local_rank("gloo", env_local_rank=None, cuda_device=None) is None
    True
    """
    if "nccl" in backend and cuda_device is not None:
        return cuda_device
    return env_local_rank


def _current_cuda_device(backend: str) -> int | None:
    # Only asked under NCCL: a CPU build of torch has no current CUDA device.
    return torch.cuda.current_device() if "nccl" in backend else None


def finalize() -> None:
    """Leave the process group and wait for the backend's threads to wind down.

    Destroys the group rankwise created; a group adopted from torch is left to the script
    that built it (and destroyed by the exit hook if still alive then). Safe to call more
    than once and when :func:`init` was never called. After :func:`init` an ``atexit`` hook
    does the same at exit, so a script that forgets ``finalize()`` still exits 0.
    """
    global _session, _membership
    owns = _session is not None and _session.owns_group
    _session = None
    if _membership is not None:
        _membership.close()
        _membership = None
    _teardown(destroy=owns)
    restore_gloo_interface()  # a later init() towards another master chooses afresh


def _teardown(destroy: bool) -> None:
    global _saw_group
    live = has_group()
    if live:
        _saw_group = True
        if destroy:
            dist.destroy_process_group()
    # gloo_threads_alive: a group the script built and destroyed itself, after init() adopted
    # it or before init() ran, was never live here, and its threads still need the drain.
    if (destroy or not live) and (_saw_group or gloo_threads_alive()):
        drain()


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
    """Index of this process on its machine (its GPU index under NCCL); 0 when not distributed.

    For a group the script built with torch (see :func:`adopted_local_rank`) under NCCL it is
    the current CUDA device; under gloo, ``LOCAL_RANK`` (or the launcher's variable) must be
    set, since the global rank says nothing about the machine: otherwise this raises
    :class:`DistributedStateError`.
    """
    if _session is not None and (_session.owns_group or _session.config.local_rank is not None):
        return _session.config.resolved_local_rank
    if has_group():
        backend = str(dist.get_backend())
        try:
            env_local = DistributedConfig.from_environment().local_rank
        except DistributedConfigError:  # the group was built from arguments, not variables
            env_local = None
        local = adopted_local_rank(backend, env_local, _current_cuda_device(backend))
        if local is None:
            raise DistributedStateError(
                f"the local rank of rank {dist.get_rank()} is unknown: torch's {backend} group "
                "was built without LOCAL_RANK in the environment, and the global rank says "
                "nothing about the machine. Set LOCAL_RANK (the process's index on its machine) "
                "before init, or start the processes with torchrun / `rankwise launch`."
            )
        return local
    return 0


def collective_timeout_ms() -> int | None:
    """How long one collective may take on the group rankwise built; None for other groups."""
    return _session.config.collective_timeout_ms if _session and _session.owns_group else None


def is_master() -> bool:
    """True on rank 0, the rank that logs and writes checkpoints; never on a process waiting
    to join (:func:`is_joining`), though it is rank 0 of its world of one until admitted."""
    return get_rank() == 0 and not is_joining()


def is_joining() -> bool:
    """True in a process that ``rankwise launch --on-failure continue`` restarted (or that came
    after the job's first generation formed) until the running ranks let it in: it runs the
    script's set-up alone, as rank 0 of a world of one, but it is not the master, so rank-0-only
    set-up (a tracker run, a download, a results folder) runs once, on the real rank 0. Its
    slot, the rank it had in the launched world, is ``rd.membership().cfg.slot``.
    """
    return _membership is not None and _membership.pending


def barrier() -> None:
    """Block until every rank reaches this call; a no-op in a world of one."""
    if has_group():
        dist.barrier()


def get_backend() -> str:
    """The live group's backend (``"gloo"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``) or ``"none"``."""
    if has_group():
        return str(dist.get_backend())
    return _session.backend if _session else "none"


def device() -> torch.device:
    """The device this rank computes on: ``cuda:<local_rank>`` under NCCL, else the CPU.

    Under NCCL this is also the current CUDA device: :func:`init` calls
    ``torch.cuda.set_device(local_rank)`` for a group it builds, and an adopted NCCL group's
    local rank is the current device. So :func:`collective_device` (which derives from this)
    agrees with it whenever the backend is NCCL alone.
    """
    if "nccl" in get_backend():
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

    ``auto`` with CUDA gives ``"cpu:gloo,cuda:nccl"`` (torch's per-device backends: CPU
    tensors still reduce), else ``"gloo"``. A pure function of what the machine has, so every
    error path is testable anywhere.

    >>> select_backend("auto", 0, cuda_devices=0, nccl_available=False)
    'gloo'
    >>> select_backend("auto", 1, cuda_devices=2, nccl_available=True)
    'cpu:gloo,cuda:nccl'
    """
    name = requested
    if requested == "auto":
        cuda = cuda_devices > 0 and nccl_available
        name = (CPU_AND_CUDA if gloo_available else "nccl") if cuda else "gloo"
    if "nccl" in name:
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


def group_device(backend: str, local_rank: int) -> torch.device | None:
    """The ``device_id`` a group of ``backend`` is built with: this rank's GPU under NCCL.

    >>> group_device("cpu:gloo,cuda:nccl", 1), group_device("gloo", 1)
    (device(type='cuda', index=1), None)
    """
    return torch.device("cuda", local_rank) if "nccl" in backend else None


def _at_exit() -> None:
    # After init(), every group goes, adopted ones too: the interpreter is about to tear the
    # backend's threads down, and a live group is what makes that abort. Without init() (a
    # script that built its group with torch, e.g. a seed guide's mp.spawn example) the group
    # stays the script's, but gloo's threads still get the drain: the same abort awaits them.
    global _session
    if _init_called:
        _session = None
        _teardown(destroy=True)
    elif gloo_threads_alive():
        drain()


atexit.register(_at_exit)  # on import: a guide's script that only imports rankwise has it too
