"""Every variable rankwise reads, as a whole: checked at once (:func:`check_variables`, which
``rd.init()`` and ``rankwise launch`` run before anything starts) and shown for diagnostics
(:func:`environment_variables`, ``rankwise env``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from rankwise.distributed.config.gloo import GLOO_IFNAME_VAR, gloo_interface
from rankwise.distributed.config.member import MemberConfig, member_kwargs, on_failure_mode
from rankwise.distributed.config.process import ENV_VARS, DistributedConfig, guide_settings
from rankwise.distributed.contract import (
    GROUP_RANK,
    JOB_TOKEN,
    LOCAL_WORLD_SIZE,
    MEMBER_TUNABLE,
    ON_FAILURE,
    SLOT,
    launcher_variables,
)
from rankwise.distributed.errors import DistributedConfigError

__all__ = ["check_variables", "environment_variables"]

# What `rankwise env` shows: DistributedConfig's variables, plus the launchers' and the devices'.
_DIAGNOSTIC_VARS = (
    *ENV_VARS.values(),
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_USE_AGENT_STORE",
    LOCAL_WORLD_SIZE,
    GROUP_RANK,
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
    GLOO_IFNAME_VAR,
)


def environment_variables() -> dict[str, str | None]:
    """The variables that shape a launch, as set now (``None`` when unset), for diagnostics.

    A ``GLOO_SOCKET_IFNAME`` that rankwise set itself shows as unset: it is not a user's choice.
    """
    found = {name: os.environ.get(name) for name in _DIAGNOSTIC_VARS}
    found[GLOO_IFNAME_VAR] = gloo_interface()
    return found


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
            shown = "<secret>" if var == JOB_TOKEN else repr(env[var])
            raise DistributedConfigError(
                f"{var}={shown} is set in the environment of `rankwise launch`, but it is the "
                "launcher's own, set for each process of --on-failure continue (and meaning "
                f"nothing elsewhere); unset it (env -u {var} rankwise launch ...)."
            )
        given = env.get(ON_FAILURE, "").strip()
        if given and given != launching:
            on_failure_mode({ON_FAILURE: given, SLOT: "0"})  # a bad value: said so
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
        slot=0, world_size=1, host="127.0.0.1", port=1, **member_kwargs(env, MEMBER_TUNABLE)
    )
    DistributedConfig(**guide_settings(env))
