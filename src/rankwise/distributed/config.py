"""Process-group configuration: with :mod:`.environment`, the only code that reads variables.

One concept, every variable rankwise reads and its check (so a new variable is checked in one
place, and the launcher's up-front check covers it); past 600 lines with gloo's interface
choice, which issue 31 moves apart with :class:`MemberConfig`.

Who this process is (rank, world size, local rank, master) comes from
:func:`rankwise.distributed.environment.detect`: torchrun, SLURM, MPI or plain ``RANK`` /
``WORLD_SIZE``. This module adds the CyxWiz guide's settings (``DISTRIBUTED_BACKEND``,
``DISTRIBUTED_TIMEOUT_MS``) and validates the whole. With no variables set the configuration
describes a world of one, so the same script runs under ``python train.py`` and under
``rankwise launch``.

:class:`MemberConfig` is the same for ``rankwise launch --on-failure continue``: the variables
that launcher sets for each process (``RANKWISE_SLOT``, ``RANKWISE_INCARNATION``, ...) and the
ones a user may tune (``RANKWISE_STALE_S``, ``RANKWISE_JOIN_CHECK_EVERY``), read and checked here
and nowhere else; :mod:`.membership` and the trainer take them from the config object.

Module state: the gloo interface rankwise itself put in ``GLOO_SOCKET_IFNAME`` (so that it can
take out its own value and never a user's, and diagnostics never show it as the user's choice)
and the interfaces already logged (each choice is logged once per process). Both are per
process, as the environment variable they shadow is.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
from collections.abc import Mapping
from typing import Any

from rankwise.distributed.environment import detect, parse_float, parse_int
from rankwise.distributed.errors import DistributedConfigError
from rankwise.distributed.interfaces import hostname_is_usable, interface_towards


class BackendType(str, enum.Enum):
    """Communication backend. ``CPU`` is the CyxWiz guide's name for gloo."""

    AUTO = "auto"
    CPU = "cpu"
    GLOO = "gloo"
    NCCL = "nccl"


_BACKEND_ALIASES = {"auto": "auto", "cpu": "gloo", "gloo": "gloo", "nccl": "nccl"}

# Where each field comes from, so that errors can name the variable the user has to change.
ENV_VARS = {
    "rank": "RANK",
    "world_size": "WORLD_SIZE",
    "local_rank": "LOCAL_RANK",
    "master_addr": "MASTER_ADDR",
    "master_port": "MASTER_PORT",
    "backend": "DISTRIBUTED_BACKEND",
    "timeout_ms": "DISTRIBUTED_TIMEOUT_MS",
    "collective_timeout_ms": "DISTRIBUTED_COLLECTIVE_TIMEOUT_MS",
}


# What `rankwise env` shows: the variables above, plus the launchers' and the devices'.
_DIAGNOSTIC_VARS = (
    *ENV_VARS.values(),
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_STEP_ID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "GLOO_SOCKET_IFNAME",
)

# torch's gloo reads it when it builds a group: the network interface its sockets bind to.
GLOO_IFNAME_VAR = "GLOO_SOCKET_IFNAME"


# The interface rankwise itself put in GLOO_SOCKET_IFNAME (not the user): gloo reads the
# variable whenever it builds a group (new_group() too), so it stays set while rankwise's group
# lives; restore_gloo_interface() takes it out again, and diagnostics never show it as chosen.
_chosen_by_rankwise: str | None = None
_logged_interfaces: set[str] = set()  # each choice is logged once per process
_log = logging.getLogger(__name__)


def gloo_interface() -> str | None:
    """The interface the user chose for gloo (``GLOO_SOCKET_IFNAME``), or ``None``."""
    value = os.environ.get(GLOO_IFNAME_VAR) or None
    return None if value is not None and value == _chosen_by_rankwise else value


def set_gloo_interface(name: str) -> None:
    """Choose gloo's interface for the groups this process builds until
    :func:`restore_gloo_interface`; the user's ``GLOO_SOCKET_IFNAME`` stays theirs."""
    global _chosen_by_rankwise
    os.environ[GLOO_IFNAME_VAR] = name
    _chosen_by_rankwise = name


def restore_gloo_interface() -> None:
    """Undo :func:`set_gloo_interface` (a value the user set since then is left alone)."""
    global _chosen_by_rankwise
    if _chosen_by_rankwise is not None and os.environ.get(GLOO_IFNAME_VAR) == _chosen_by_rankwise:
        del os.environ[GLOO_IFNAME_VAR]
    _chosen_by_rankwise = None


def choose_gloo_interface(master_addr: str, world_size: int) -> str | None:
    """Bind gloo to the interface that reaches the master where its own default cannot.

    gloo binds to the hostname's address, or the loopback one when that is not an address of
    this machine: on a host whose name maps to ``127.0.x.1`` it tells peers on other hosts to
    connect to themselves. Only then does rankwise choose (until
    :func:`restore_gloo_interface`); a ``GLOO_SOCKET_IFNAME`` of the user's, a usable hostname
    (gloo's choice, perhaps a faster fabric) and a one-machine job keep torch's behaviour.
    Returns the interface rankwise chose, or ``None``.
    """
    if gloo_interface() is not None or hostname_is_usable():
        return None
    name = interface_towards(master_addr, spans_hosts(world_size))
    if name is None:
        return None
    set_gloo_interface(name)
    if name not in _logged_interfaces:
        _logged_interfaces.add(name)
        _log.info(
            "gloo binds to %s (GLOO_SOCKET_IFNAME), the interface towards MASTER_ADDR=%s: "
            "this host's name resolves to no address its peers can reach. Set "
            "GLOO_SOCKET_IFNAME to choose another.",
            name,
            master_addr,
        )
    return name


def spans_hosts(world_size: int, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the launcher says the job's ``world_size`` ranks run on more than one machine.

    From the per-machine count (torchrun's ``LOCAL_WORLD_SIZE``, Open MPI's and MPICH's), else
    SLURM's node count; ``False`` when nothing says.

    >>> spans_hosts(8, {"LOCAL_WORLD_SIZE": "4"}), spans_hosts(4, {"LOCAL_WORLD_SIZE": "4"})
    (True, False)
    """
    env = os.environ if environ is None else environ
    for var in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        raw = env.get(var, "").strip()
        if raw.isdigit():
            return 0 < int(raw) < world_size
    nodes = (env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or "").strip()
    return nodes.isdigit() and int(nodes) > 1


def environment_variables() -> dict[str, str | None]:
    """The variables that shape a launch, as set now (``None`` when unset), for diagnostics.

    A ``GLOO_SOCKET_IFNAME`` that rankwise set itself shows as unset: it is not a user's choice.
    """
    found = {name: os.environ.get(name) for name in _DIAGNOSTIC_VARS}
    found[GLOO_IFNAME_VAR] = gloo_interface()
    return found


def normalize_backend(backend: str | BackendType) -> str:
    """Return ``"auto"``, ``"gloo"`` or ``"nccl"``; ``"cpu"`` means gloo.

    >>> normalize_backend("CPU"), normalize_backend(BackendType.NCCL)
    ('gloo', 'nccl')
    """
    name = backend.value if isinstance(backend, BackendType) else backend
    if not isinstance(name, str) or name.lower() not in _BACKEND_ALIASES:
        raise DistributedConfigError(
            f"backend {backend!r} is not supported (DISTRIBUTED_BACKEND); "
            "use one of 'auto', 'gloo' (alias 'cpu') or 'nccl'."
        )
    return _BACKEND_ALIASES[name.lower()]


@dataclasses.dataclass
class DistributedConfig:
    """Who this process is and how it reaches its peers.

    Mutable on purpose: the CyxWiz guide builds one with no arguments and sets attributes
    (``config.rank = 0``); :meth:`validate` runs on construction and again in
    :func:`rankwise.distributed.init`, so late assignments are checked too.

    ``local_rank=None`` means "same as rank" (the CyxWiz default for ``LOCAL_RANK``).
    ``timeout_ms`` bounds the rendezvous (connecting, waiting for peers: the CyxWiz guide's
    "connection timeout"); ``collective_timeout_ms`` bounds each collective once running, and
    defaults to torch's 30 minutes, so rank 0 can save a checkpoint while the others wait.
    ``environment`` says what started the process (``"torchelastic"``, ``"slurm"``,
    ``"openmpi"``, ``"mpich"``, ``"plain"``, or ``"none"`` for a bare ``python train.py``);
    any launcher gives even a world of one a real process group. ``use_agent_store`` and
    ``restart_count`` are torchrun's: whether its agent hosts the store at MASTER_ADDR:PORT,
    and this node's restart count (shown by ``rankwise env``; never used as a store key,
    since nodes count restarts differently).

    >>> DistributedConfig(rank=1, world_size=2).resolved_local_rank
    1
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int | None = None
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    backend: str | BackendType = "auto"
    timeout_ms: int = 30000
    collective_timeout_ms: int = 1_800_000
    use_agent_store: bool = False
    restart_count: int = 0
    environment: str = "none"

    def __post_init__(self) -> None:
        self.validate()

    @property
    def resolved_local_rank(self) -> int:
        return self.rank if self.local_rank is None else self.local_rank

    @property
    def launched(self) -> bool:
        """Started by a launcher (torchrun, srun, mpirun, RANK/WORLD_SIZE set), not bare."""
        return self.environment != "none"

    @property
    def backend_name(self) -> str:
        """The backend as ``"auto"``, ``"gloo"`` or ``"nccl"``."""
        return normalize_backend(self.backend)

    def validate(self) -> DistributedConfig:
        """Check every field; raise :class:`DistributedConfigError` naming value and fix."""
        for name in (
            "rank",
            "world_size",
            "master_port",
            "timeout_ms",
            "collective_timeout_ms",
            "restart_count",
        ):
            _require_int(name, getattr(self, name))
        if self.local_rank is not None:
            _require_int("local_rank", self.local_rank)
        if self.world_size < 1:
            raise DistributedConfigError(
                f"world_size ({self.world_size}) must be >= 1 (WORLD_SIZE): it is the total "
                "number of processes, e.g. WORLD_SIZE=2 for two ranks."
            )
        if self.rank < 0:
            raise DistributedConfigError(
                f"rank ({self.rank}) must be >= 0 (RANK): ranks are numbered from 0."
            )
        if self.rank >= self.world_size:
            raise DistributedConfigError(
                f"rank ({self.rank}) must be < world_size ({self.world_size}): ranks are "
                f"numbered 0..{self.world_size - 1}; fix RANK or WORLD_SIZE."
            )
        if self.local_rank is not None and self.local_rank < 0:
            raise DistributedConfigError(
                f"local_rank ({self.local_rank}) must be >= 0 (LOCAL_RANK): it is the device "
                "index on this machine."
            )
        if not 1 <= self.master_port <= 65535:
            raise DistributedConfigError(
                f"master_port ({self.master_port}) must be in 1..65535 (MASTER_PORT); "
                "pick a free port such as 29500, or let `rankwise launch` choose one."
            )
        if not isinstance(self.master_addr, str) or not self.master_addr.strip():
            raise DistributedConfigError(
                f"master_addr ({self.master_addr!r}) must be a host name or IP address "
                "(MASTER_ADDR), e.g. 127.0.0.1 on one machine."
            )
        for name in ("timeout_ms", "collective_timeout_ms"):
            if getattr(self, name) <= 0:
                raise DistributedConfigError(
                    f"{name} ({getattr(self, name)}) must be > 0 ({ENV_VARS[name]}), "
                    "e.g. 30000 for 30 seconds."
                )
        normalize_backend(self.backend)
        return self

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> DistributedConfig:
        """Build a config from the launcher's variables (see :mod:`.environment`) and the
        CyxWiz guide's.

        Missing variables take the defaults of a world of one. ``environ`` defaults to
        ``os.environ`` and exists so the parsing can be tested as a pure function.

        >>> DistributedConfig.from_environment({"RANK": "1", "WORLD_SIZE": "2"}).rank
        1
        """
        env = os.environ if environ is None else environ
        found = detect(env)
        kwargs: dict[str, Any] = {
            "rank": found.rank,
            "world_size": found.world_size,
            "local_rank": found.local_rank,
            "environment": found.kind,
        }
        if found.master_addr is not None:
            kwargs["master_addr"] = found.master_addr
        if found.master_port is not None:
            kwargs["master_port"] = found.master_port
        kwargs.update(_settings(env))
        if found.kind == "torchelastic":
            kwargs["use_agent_store"] = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            raw_restart = env.get("TORCHELASTIC_RESTART_COUNT")
            if raw_restart:
                kwargs["restart_count"] = parse_int("TORCHELASTIC_RESTART_COUNT", raw_restart)
        return cls(**kwargs)


def _settings(env: Mapping[str, str]) -> dict[str, Any]:
    """The CyxWiz guide's settings given in ``env`` (backend, timeouts) as config fields."""
    kwargs: dict[str, Any] = {}
    for field in ("timeout_ms", "collective_timeout_ms"):
        raw = env.get(ENV_VARS[field])
        if raw is not None and raw.strip() != "":
            kwargs[field] = parse_int(ENV_VARS[field], raw)
    if env.get("DISTRIBUTED_BACKEND"):
        kwargs["backend"] = env["DISTRIBUTED_BACKEND"]
    return kwargs


def _require_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DistributedConfigError(
            f"{name} ({value!r}) must be an integer ({ENV_VARS.get(name, name)}), "
            f"got {type(value).__name__}."
        )


# -- --on-failure continue ---------------------------------------------------------------------

ON_FAILURE = "RANKWISE_ON_FAILURE"

# Where each MemberConfig field comes from; MEMBER_TUNABLE are the user's, the rest the launcher's.
MEMBER_ENV_VARS = {
    "slot": "RANKWISE_SLOT",
    "world_size": "WORLD_SIZE",
    "host": "MASTER_ADDR",
    "port": "MASTER_PORT",
    "incarnation": "RANKWISE_INCARNATION",
    "min_nproc": "RANKWISE_MIN_NPROC",
    "collective_timeout_s": "DISTRIBUTED_COLLECTIVE_TIMEOUT_MS",
    "stale_s": "RANKWISE_STALE_S",
    "join_check_every": "RANKWISE_JOIN_CHECK_EVERY",
    "job_token": "RANKWISE_JOB_TOKEN",
    "job_id": "RANKWISE_JOB_ID",
    "local_world_size": "LOCAL_WORLD_SIZE",
}


# The MemberConfig fields a user may set (the other variables are `rankwise launch`'s own).
MEMBER_TUNABLE = ("collective_timeout_s", "stale_s", "join_check_every")


def launcher_variables() -> tuple[str, ...]:
    """The ``RANKWISE_*`` variables ``rankwise launch --on-failure continue`` sets for each
    process (never the user).

    >>> launcher_variables()[:2]
    ('RANKWISE_SLOT', 'RANKWISE_INCARNATION')
    """
    return tuple(
        var for field, var in MEMBER_ENV_VARS.items()
        if var.startswith("RANKWISE_") and field not in MEMBER_TUNABLE
    )  # fmt: skip


def rankwise_variables() -> tuple[str, ...]:
    """Every ``RANKWISE_*`` variable rankwise reads (:func:`check_variables` checks them all).

    >>> "RANKWISE_ON_FAILURE" in rankwise_variables()
    True
    """
    return (ON_FAILURE, *(v for v in MEMBER_ENV_VARS.values() if v.startswith("RANKWISE_")))


def check_variables(environ: Mapping[str, str] | None = None, launching: str | None = None) -> None:
    """Check every variable rankwise reads (``RANKWISE_*`` and the ``DISTRIBUTED_*`` settings);
    raise one :class:`DistributedConfigError` naming the variable, its value and the fix.

    ``launching``: the ``--on-failure`` of a ``rankwise launch`` about to start processes with
    this environment, which checks it once, before any of them starts: the variables it sets
    for each process must not be set already, and ``RANKWISE_ON_FAILURE`` (which it sets from
    ``--on-failure``) must not say otherwise. ``None``: this process reads them for itself (a
    rank, or a script under plain ``python``), where an unset launcher is caught too.

    >>> check_variables({"RANKWISE_STALE_S": "2"})
    >>> check_variables({"RANKWISE_ON_FAILURE": "sometimes"})
    Traceback (most recent call last):
    ...
    rankwise.distributed.errors.DistributedConfigError: RANKWISE_ON_FAILURE ('sometimes') ...
    """
    env = os.environ if environ is None else environ
    owned = [var for var in launcher_variables() if env.get(var) is not None]
    if launching is not None:
        if owned:
            var = owned[0]
            shown = "<secret>" if var == "RANKWISE_JOB_TOKEN" else repr(env[var])
            raise DistributedConfigError(
                f"{var}={shown} is set in the environment of `rankwise launch`, but it is the "
                "launcher's own, set for each process of --on-failure continue (and meaning "
                f"nothing elsewhere); unset it (env -u {var} rankwise launch ...)."
            )
        given = env.get(ON_FAILURE, "").strip()
        if given and given != launching:
            on_failure_mode({ON_FAILURE: given, "RANKWISE_SLOT": "0"})  # a bad value: said so
            raise DistributedConfigError(
                f"{ON_FAILURE}={given!r} is set in the environment of `rankwise launch "
                f"--on-failure {launching}`, which takes the mode from --on-failure only; "
                f"unset it, and give --on-failure {given} to the launcher instead."
            )
    elif on_failure_mode(env) == "continue":
        MemberConfig.from_environment(env)  # every variable of the mode, as the ranks read it
    elif owned:
        raise DistributedConfigError(
            f"{owned[0]} is set, but {ON_FAILURE} is not 'continue': it is set by `rankwise "
            f"launch --on-failure continue` for each of its processes and means nothing "
            f"elsewhere; unset {owned[0]} (or start the job with that launcher)."
        )
    MemberConfig(
        slot=0, world_size=1, host="127.0.0.1", port=1, **_member_kwargs(env, MEMBER_TUNABLE)
    )
    DistributedConfig(**_settings(env))


def on_failure_mode(environ: Mapping[str, str] | None = None) -> str:
    """``"restart"`` (torchrun's stop-the-world restarts, the default) or ``"continue"``.

    ``continue`` needs the store ``rankwise launch --on-failure continue`` hosts; set by hand or
    under plain torchrun it is refused, naming the fix.

    >>> on_failure_mode({})
    'restart'
    """
    env = os.environ if environ is None else environ
    mode = env.get(ON_FAILURE, "restart").strip() or "restart"
    if mode not in ("restart", "continue"):
        raise DistributedConfigError(
            f"{ON_FAILURE} ({mode!r}) must be 'restart' or 'continue'; `rankwise launch "
            f"--on-failure ...` sets it: unset {ON_FAILURE} and give the launcher --on-failure."
        )
    if mode == "continue" and "RANKWISE_SLOT" not in env:
        launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "this launcher"
        raise DistributedConfigError(
            f"{ON_FAILURE}=continue needs the membership store that `rankwise launch "
            f"--on-failure continue` hosts, and {launcher} did not start one. Start the job "
            "with `rankwise launch --nproc-per-node N --on-failure continue train.py`, or "
            f"unset {ON_FAILURE} to restart the whole world on a failure."
        )
    return mode


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class MemberConfig:
    """What ``rankwise launch --on-failure continue`` tells each process, checked on
    construction (an error names the variable, its value and the fix).

    >>> MemberConfig(slot=1, world_size=3, host="127.0.0.1", port=29500).join_check_every
    1
    >>> MemberConfig(slot=0, world_size=2, host="127.0.0.1", port=29500, stale_s=0)
    Traceback (most recent call last):
    ...
    rankwise.distributed.errors.DistributedConfigError: RANKWISE_STALE_S=0 is refused: ...
    """

    slot: int  # the rank this process had in generation 0 (stable across its restarts)
    world_size: int  # generation 0's size
    host: str
    port: int
    incarnation: int = 0  # 0 for the first start of this slot, n for its n-th restart
    min_nproc: int = 1
    collective_timeout_s: float = 1800.0
    stale_s: float = 2.0  # a heartbeat still for this long means the process is gone
    # Every this many optimizer steps the members look for restarted ranks waiting to join
    # (0: never; the launcher sets 0 under --max-restarts 0, where nobody can come back).
    join_check_every: int = 1
    # The job's secret (hex), which a restarted process proves to be let in (never in the
    # store, never printed); "" where the launcher gave none (no proof is asked).
    job_token: str = dataclasses.field(default="", repr=False)
    # The job's id (hex, from the job's store): every signed store value and join proof names
    # it, so none is good in another job that shares the secret; "" where none was given.
    job_id: str = ""
    # Processes per node (LOCAL_WORLD_SIZE); 0: not said, one node
    local_world_size: int = 0

    @property
    def nnodes(self) -> int:
        """The job's nodes (``--nnodes``): the launched world over the processes per node.

        >>> MemberConfig(slot=0, world_size=8, host="h", port=1, local_world_size=4).nnodes
        2
        """
        return max(self.world_size // self.local_world_size, 1) if self.local_world_size else 1

    def __post_init__(self) -> None:
        for field, holds, rule, fix in self._rules():
            if not holds:
                var = MEMBER_ENV_VARS[field]
                value = getattr(self, field)
                if field == "collective_timeout_s":
                    value = round(value * 1000)  # the variable is in milliseconds
                shown = "<secret>" if field == "job_token" else repr(value)
                raise DistributedConfigError(f"{var}={shown} is refused: {rule}; {fix}.")

    def _rules(self) -> list[tuple[str, bool, str, str]]:
        """``(field, holds, the rule, the fix)`` for every field."""
        last = self.world_size - 1
        by_launcher = "`rankwise launch --on-failure continue` sets it; do not set it by hand"
        return [
            ("world_size", self.world_size >= 1, "the launched world has 1 process or more",
             by_launcher),
            ("slot", 0 <= self.slot <= last,
             f"a slot is a rank of the launched world, 0..{last}", by_launcher),
            ("host", bool(str(self.host).strip()),
             "the membership store's host must be an address",
             "give `rankwise launch` --master-addr (or --store-endpoint)"),
            ("port", 1 <= self.port <= 65535, "a port is in 1..65535",
             "give `rankwise launch` a free --master-port (or --store-endpoint)"),
            ("incarnation", self.incarnation >= 0,
             "a slot's start count is 0 or more (0: its first start)", by_launcher),
            ("min_nproc", 1 <= self.min_nproc <= max(self.world_size, 1),
             f"--min-nproc must be in 1..{self.world_size}, the launched world",
             "give `rankwise launch` a --min-nproc in that range"),
            ("collective_timeout_s", self.collective_timeout_s > 0,
             "the collective timeout must be > 0",
             "e.g. DISTRIBUTED_COLLECTIVE_TIMEOUT_MS=1800000 (30 minutes), or unset it"),
            ("stale_s", self.stale_s > 0,
             "the stale time must be > 0 seconds (a heartbeat that stands still this long "
             "means its rank is gone)", "e.g. RANKWISE_STALE_S=2 (the default), or unset it"),
            ("join_check_every", self.join_check_every >= 0,
             "the optimizer steps between looks for restarted ranks must be 0 (never) or more",
             "e.g. RANKWISE_JOIN_CHECK_EVERY=1 (every step, the default), or unset it"),
            ("job_token", _is_hex(self.job_token),
             "the job's secret is hex digits (its value is not shown)", by_launcher),
            ("job_id", len(self.job_id) <= 64 and _is_hex(self.job_id),
             "the job's id is up to 64 hex digits", by_launcher),
            ("local_world_size", 0 <= self.local_world_size <= self.world_size,
             f"the processes per node are 1..{self.world_size}, the launched world",
             by_launcher),
        ]  # fmt: skip

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> MemberConfig | None:
        """The launcher's variables, or None when the mode is ``restart``.

        >>> MemberConfig.from_environment({}) is None
        True
        >>> MemberConfig.from_environment({"RANKWISE_ON_FAILURE": "continue",
        ...     "RANKWISE_SLOT": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}).slot
        1
        """
        env = os.environ if environ is None else environ
        if on_failure_mode(env) != "continue":
            return None
        kwargs = _member_kwargs(env, tuple(MEMBER_ENV_VARS))
        kwargs["host"] = kwargs.get("host") or "127.0.0.1"
        kwargs["job_token"] = kwargs.get("job_token", "").strip()
        kwargs["job_id"] = kwargs.get("job_id", "").strip()
        for field in ("slot", "world_size", "port"):
            if field not in kwargs:
                raise DistributedConfigError(
                    f"{MEMBER_ENV_VARS[field]} is not set, and {ON_FAILURE}=continue needs it; "
                    "start the job with `rankwise launch --on-failure continue`, which sets it."
                )
        return cls(**kwargs)


_MEMBER_INTS = ("slot", "world_size", "port", "incarnation", "min_nproc", "join_check_every",
                "local_world_size")  # fmt: skip


def _member_kwargs(env: Mapping[str, str], fields: tuple[str, ...]) -> dict[str, Any]:
    """``fields`` of :class:`MemberConfig` as given in ``env`` (unset or blank: left out),
    parsed; a value that is not a number raises, naming the variable."""
    kwargs: dict[str, Any] = {}
    for field in fields:
        var = MEMBER_ENV_VARS[field]
        raw = env.get(var)
        if raw is None or raw.strip() == "":
            continue
        if field in _MEMBER_INTS:
            kwargs[field] = parse_int(var, raw)
        elif field == "stale_s":
            kwargs[field] = parse_float(var, raw)
        elif field == "collective_timeout_s":
            kwargs[field] = parse_int(var, raw) / 1000  # the variable is in milliseconds
        else:
            kwargs[field] = raw
    return kwargs
