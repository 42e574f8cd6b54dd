"""Who this process is and how it reaches its peers: :class:`DistributedConfig`.

Who this process is (rank, world size, local rank, master) comes from
:func:`rankwise.distributed.environment.detect`: torchrun, SLURM, MPI or plain ``RANK`` /
``WORLD_SIZE``. This module adds the CyxWiz guide's settings (``DISTRIBUTED_BACKEND``,
``DISTRIBUTED_TIMEOUT_MS``, ``DISTRIBUTED_COLLECTIVE_TIMEOUT_MS``) and validates the whole.
With no variables set the configuration describes a world of one, so the same script runs
under ``python train.py`` and under ``rankwise launch``.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from typing import Any

from rankwise.distributed.contract import COLLECTIVE_TIMEOUT_MS
from rankwise.distributed.environment import detect, parse_int
from rankwise.distributed.errors import DistributedConfigError

__all__ = [
    "ENV_VARS",
    "BackendType",
    "DistributedConfig",
    "guide_settings",
    "normalize_backend",
]


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
    "collective_timeout_ms": COLLECTIVE_TIMEOUT_MS,  # continue mode reads it too
}


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
        kwargs.update(guide_settings(env))
        if found.kind == "torchelastic":
            kwargs["use_agent_store"] = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            raw_restart = env.get("TORCHELASTIC_RESTART_COUNT")
            if raw_restart:
                kwargs["restart_count"] = parse_int("TORCHELASTIC_RESTART_COUNT", raw_restart)
        return cls(**kwargs)


def guide_settings(env: Mapping[str, str]) -> dict[str, Any]:
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
