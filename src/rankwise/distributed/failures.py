"""What a failed operation says about the job: one classifier for every caller.

A rank's exception is one of three things, and each caller acts on exactly that:

- ``"timeout"``: a collective or a store operation ran out of time (a peer is frozen, or
  slower than the collective timeout). :class:`~rankwise.distributed.progress.Progress`
  names the ranks behind; continue mode removes the frozen peer.
- ``"peer-lost"``: the transport says a peer went away (its socket closed or reset, the
  store's host refused or dropped the connection). Continue mode regroups the survivors.
- ``None``: the rank's own failure: its model, its data, its storage. It is never taken for a
  lost peer, even when its text mentions a timeout (``DataLoader timed out``, a storage read
  that timed out) or a socket: only torch's distributed errors and the messages of its
  communication backends (gloo, NCCL, c10d), which name their source, count.

rankwise's own :class:`~rankwise.distributed.errors.PeerLostError` (a joiner lost on its way
into a new generation) is a lost peer too. gloo raises plain ``RuntimeError`` s whose text starts with its source file
(``[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer``); torch's own errors are
``torch.distributed.DistError`` subclasses. Both are read here and nowhere else.

>>> classify(RuntimeError("[third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer"))
'peer-lost'
>>> classify(RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms"))
'timeout'
>>> classify(RuntimeError("DataLoader timed out after 5 seconds")) is None   # its own
True
>>> classify(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
True
"""

from __future__ import annotations

from typing import Literal

import torch.distributed as dist

from rankwise.distributed.errors import PeerLostError

Failure = Literal["timeout", "peer-lost"]

# Where a message comes from torch's communication stack: gloo and NCCL name their source
# files, c10d tags its own messages.
_BACKEND_TAGS = ("gloo/", "gloo:", "[gloo", "nccl", "[c10d]", "c10d/", "processgroup")
_TIMEOUT_WORDS = ("timed out", "timeout")
# A peer's connection ended: it exited, was killed, or (with 3+ ranks) timed out waiting for
# a rank that never came and gave up first, closing its connections to the others.
_GONE_WORDS = (
    "connection closed by peer",
    "connection reset",
    "broken pipe",
    "connection refused",
    "socket",
)


def classify(exc: BaseException) -> Failure | None:
    """``"timeout"``, ``"peer-lost"`` or None (the rank's own failure); see the module doc."""
    text = str(exc).lower()
    if isinstance(exc, PeerLostError):  # rankwise's own finding (membership.py)
        return "peer-lost"
    if isinstance(exc, dist.DistError):
        # torch's distributed errors: the store, the network, the backend. A store or network
        # error that is not a timeout means the other end is gone.
        return "timeout" if any(w in text for w in _TIMEOUT_WORDS) else "peer-lost"
    if not isinstance(exc, RuntimeError) or not any(tag in text for tag in _BACKEND_TAGS):
        return None
    if any(w in text for w in _TIMEOUT_WORDS):
        return "timeout"
    if any(w in text for w in _GONE_WORDS):
        return "peer-lost"
    return None


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's report of a collective or store operation out of time
    (never another library's timeout).

    >>> is_timeout(RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting"))
    True
    >>> is_timeout(RuntimeError("DataLoader timed out after 5 seconds"))
    False
    """
    return classify(exc) == "timeout"


def is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says a peer is gone or frozen, rather than that this rank failed.

    >>> is_peer_failure(RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer"))
    True
    >>> is_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    False
    """
    return classify(exc) is not None
