"""Configuration read from the environment: with :mod:`rankwise.distributed.environment`, the
only code that reads variables (tests/test_architecture.py holds every layer to it).

One module per concept:

- :mod:`.process`: :class:`DistributedConfig`, who this process is and how it reaches its
  peers (rank, world size, master, backend, timeouts);
- :mod:`.member`: :class:`MemberConfig`, what ``rankwise launch --on-failure continue`` tells
  each process (the names are :mod:`rankwise.distributed.contract`'s);
- :mod:`.variables`: every variable at once, checked up front (:func:`check_variables`) and
  shown for diagnostics (:func:`environment_variables`);
- :mod:`.gloo`: gloo's network interface, which rankwise chooses where gloo's own default
  cannot reach the peers.

The names below are this package's public face (``from rankwise.distributed.config import
MemberConfig`` and the rest keep working as they did when it was one module).
"""

from __future__ import annotations

from rankwise.distributed.config.gloo import (
    GLOO_IFNAME_VAR,
    choose_gloo_interface,
    gloo_interface,
    restore_gloo_interface,
    set_gloo_interface,
    spans_hosts,
)
from rankwise.distributed.config.member import MemberConfig, on_failure_mode
from rankwise.distributed.config.process import (
    ENV_VARS,
    BackendType,
    DistributedConfig,
    normalize_backend,
)
from rankwise.distributed.config.variables import check_variables, environment_variables
from rankwise.distributed.contract import (
    MEMBER_ENV_VARS,
    MEMBER_TUNABLE,
    ON_FAILURE,
    launcher_variables,
    rankwise_variables,
)

__all__ = [
    "ENV_VARS",
    "GLOO_IFNAME_VAR",
    "MEMBER_ENV_VARS",
    "MEMBER_TUNABLE",
    "ON_FAILURE",
    "BackendType",
    "DistributedConfig",
    "MemberConfig",
    "check_variables",
    "choose_gloo_interface",
    "environment_variables",
    "gloo_interface",
    "launcher_variables",
    "normalize_backend",
    "on_failure_mode",
    "rankwise_variables",
    "restore_gloo_interface",
    "set_gloo_interface",
    "spans_hosts",
]
