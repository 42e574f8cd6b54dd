"""Error types raised by :mod:`rankwise.distributed`.

Each message names the offending variable, its value and the fix, so a misconfigured launch
fails before any socket is opened instead of hanging.
"""

from __future__ import annotations


class DistributedConfigError(ValueError):
    """A distributed setting (argument or environment variable) is invalid."""


class DistributedTimeoutError(TimeoutError):
    """Peers did not arrive within the configured timeout."""


class DistributedStateError(RuntimeError):
    """The process group is in the wrong state for the call (e.g. initialised twice)."""


class DistributedConnectionError(ConnectionError):
    """A peer, or the store's host, went away while the group was being built."""


class PeerLostError(RuntimeError):
    """rankwise itself found a peer gone (not torch's transport): e.g. a joiner let into a new
    generation that died on its way in. :func:`rankwise.distributed.classify` calls it a lost
    peer, so continue mode recovers from it as from a closed connection."""
