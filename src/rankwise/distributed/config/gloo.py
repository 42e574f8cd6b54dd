"""gloo's network interface: where rankwise chooses it, and how it gives the choice back.

gloo binds each group's sockets to the interface ``GLOO_SOCKET_IFNAME`` names, else to the
hostname's address. On a host whose name resolves to loopback that tells peers on other hosts
to connect to themselves, so there (only) rankwise chooses the interface that reaches the
master (:func:`choose_gloo_interface`) for the groups the process builds, and takes its own
value out again afterwards (:func:`restore_gloo_interface`); a user's ``GLOO_SOCKET_IFNAME``
is always theirs.

Module state: the gloo interface rankwise itself put in ``GLOO_SOCKET_IFNAME`` (so that it can
take out its own value and never a user's, and diagnostics never show it as the user's choice)
and the interfaces already logged (each choice is logged once per process). Both are per
process, as the environment variable they shadow is.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from rankwise.distributed.interfaces import hostname_is_usable, interface_towards

__all__ = [
    "GLOO_IFNAME_VAR",
    "choose_gloo_interface",
    "gloo_interface",
    "restore_gloo_interface",
    "set_gloo_interface",
    "spans_hosts",
]

# torch's gloo reads it when it builds a group: the network interface its sockets bind to.
GLOO_IFNAME_VAR = "GLOO_SOCKET_IFNAME"


# The interface rankwise itself put in GLOO_SOCKET_IFNAME (not the user): gloo reads the
# variable whenever it builds a group (new_group() too), so it stays set while rankwise's group
# lives; restore_gloo_interface() takes it out again, and diagnostics never show it as chosen.
_chosen_by_rankwise: str | None = None
_logged_interfaces: set[str] = set()  # each choice is logged once per process
# The package's logger, as before the split (docs/distributed.md names it).
_log = logging.getLogger("rankwise.distributed.config")


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
