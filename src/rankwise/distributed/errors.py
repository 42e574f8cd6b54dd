"""Error types raised by :mod:`rankwise.distributed`.

Each message names the offending variable, its value and the fix, so a misconfigured launch
fails before any socket is opened instead of hanging.
"""

from __future__ import annotations

import warnings


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


def first_line(exc: BaseException) -> str:
    """The first line of what ``exc`` says (its type's name where it says nothing), for a
    message that quotes torch.

    >>> first_line(RuntimeError("wait timeout after 3000ms\\n  more")), first_line(KeyError())
    ('wait timeout after 3000ms', 'KeyError')
    """
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


class RankwiseWarning(UserWarning):
    """The base of every warning rankwise gives (a ``UserWarning``, so ``pytest.warns`` and
    ``warnings`` filters on ``UserWarning`` still catch it). Printed as ``file:line:
    Category: message``, without the echo of the source line that called rankwise (see
    :func:`plain_warnings`): the message says what happened and the fix."""


def plain_warnings() -> None:
    """Print :class:`RankwiseWarning` s without the source line ``warnings`` echoes after
    each (``  self.save(state)``, which says nothing); every other warning prints as before.
    Wraps ``warnings.formatwarning`` (which ``showwarning`` and ``logging.captureWarnings``
    both use) once, chaining to the one that was there; ``import rankwise`` calls it."""
    if getattr(warnings.formatwarning, "rankwise_plain", False):
        return
    previous = warnings.formatwarning

    def formatwarning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        line: str | None = None,
    ) -> str:
        if issubclass(category, RankwiseWarning):
            line = ""  # given: the source file is not read
        return previous(message, category, filename, lineno, line)

    formatwarning.rankwise_plain = True  # type: ignore[attr-defined]
    warnings.formatwarning = formatwarning
