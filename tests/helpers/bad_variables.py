"""A bad value for every variable rankwise reads (tests/launch/test_launch_inputs.py,
tests/distributed/test_distributed_variables.py)."""

from __future__ import annotations

from rankwise.distributed.config import ENV_VARS, rankwise_variables

# A value each variable refuses. The launcher sets the slot, incarnation, min-nproc, token and
# job id for each process itself, so any value of them in its own environment is refused (the
# token's never shown).
BAD = {
    "RANKWISE_ON_FAILURE": "sometimes",
    "RANKWISE_SLOT": "1",
    "RANKWISE_INCARNATION": "0",
    "RANKWISE_MIN_NPROC": "1",
    "RANKWISE_JOB_TOKEN": "ab" * 16,
    "RANKWISE_JOB_ID": "cd" * 16,
    "RANKWISE_STALE_S": "0",
    "RANKWISE_SETUP_TIMEOUT_S": "-1",
    "RANKWISE_JOIN_CHECK_EVERY": "-1",
    "DISTRIBUTED_BACKEND": "mpi",
    "DISTRIBUTED_TIMEOUT_MS": "soon",
    "DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "0",
}


def read_variables() -> set[str]:
    """Every RANKWISE_* variable the code reads (the table of rankwise.distributed.contract)
    and the DISTRIBUTED_* settings a user gives the ranks."""
    return set(rankwise_variables()) | {v for v in ENV_VARS.values() if v.startswith("DIST")}
