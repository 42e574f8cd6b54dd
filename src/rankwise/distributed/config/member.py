"""What ``rankwise launch --on-failure continue`` tells each process: :class:`MemberConfig`.

The variables that launcher sets for each process (``RANKWISE_SLOT``, ``RANKWISE_INCARNATION``,
...) and the ones a user may tune (``RANKWISE_STALE_S``, ``RANKWISE_SETUP_TIMEOUT_S``,
``RANKWISE_JOIN_CHECK_EVERY``), read
and checked here and nowhere else; their names are the contract's
(:mod:`rankwise.distributed.contract`), which the launcher writes through
:func:`~rankwise.distributed.contract.member_environment`. :mod:`rankwise.distributed.membership`
and the trainer take them from the config object.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from rankwise.distributed.contract import MEMBER_ENV_VARS, ON_FAILURE, SLOT
from rankwise.distributed.environment import parse_float, parse_int
from rankwise.distributed.errors import DistributedConfigError

__all__ = ["MemberConfig", "member_kwargs", "on_failure_mode"]


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
    if mode == "continue" and SLOT not in env:
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
    # How long a generation's gloo group may take to form (every member's address, then a
    # connection to each; capped by the collective timeout): a member lost in there is given
    # up on after this long, not after the collective timeout. A live world of hundreds of
    # ranks forms in seconds; raise it for thousands.
    setup_timeout_s: float = 30.0
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
            ("setup_timeout_s", self.setup_timeout_s > 0,
             "a generation's group needs more than 0 seconds to form",
             "e.g. RANKWISE_SETUP_TIMEOUT_S=30 (the default), or unset it"),
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
        kwargs = member_kwargs(env, tuple(MEMBER_ENV_VARS))
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


def member_kwargs(env: Mapping[str, str], fields: tuple[str, ...]) -> dict[str, Any]:
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
        elif field in ("stale_s", "setup_timeout_s"):
            kwargs[field] = parse_float(var, raw)
        elif field == "collective_timeout_s":
            kwargs[field] = parse_int(var, raw) / 1000  # the variable is in milliseconds
        else:
            kwargs[field] = raw
    return kwargs
