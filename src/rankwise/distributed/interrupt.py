"""Ctrl-C under ``rankwise launch``: a rank ends quietly, its launcher says what happened.

A terminal's Ctrl-C reaches every process of the job (``--on-failure continue``: the ranks share
the launcher's process group) or is forwarded to them (torchrun's agent sends each rank the
SIGINT it got). Each rank then raises ``KeyboardInterrupt`` wherever it is, and the peers of the
first to end fail in their collective: N tracebacks that say nothing but "interrupted", before
the launcher's one line. Under the launcher, :func:`quiet_interrupts` keeps the interrupt itself
(a script's ``except KeyboardInterrupt`` and ``finally`` blocks run as ever, and the process
still ends by SIGINT) and only drops the traceback of one that ends the process.

The same goes for a failure one rank owns and the others only follow (a checkpoint write, a
check of the checkpoint store, issue 33): :func:`owned_by` marks the followers' exception with
the owning rank, and where it ends the process the hook prints one line naming that rank
instead of the same traceback again; the owner's traceback is printed in full, as ever.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TypeVar

__all__ = ["owned_by", "quiet_interrupts"]

E = TypeVar("E", bound=BaseException)
_OWNER = "rankwise_owner_rank"


def owned_by(error: E, owner: int, me: int, what: str) -> E:
    """Mark ``error`` as one rank ``me`` raises because ``what`` (a clause: "rank 0's
    checkpoint write failed") happened on rank ``owner``, which reports it in full; return
    it. Under ``rankwise launch`` an uncaught one ends this process with one line instead of
    a traceback."""
    if owner != me:
        setattr(error, _OWNER, (owner, me, what))
    return error


def follower_line(error: BaseException) -> str | None:
    """The one line a rank ends with for ``error``, owned by another rank (None where nobody
    marked it: its own)."""
    marked = getattr(error, _OWNER, None)
    if marked is None:
        return None
    owner, me, what = marked
    reason = getattr(error, "reason", None)
    kind = type(error).__name__ + (f", {reason}" if reason else "")
    return (
        f"rankwise: rank {me} stops: {what} ({kind}); rank {owner} prints the error in full, "
        "with its traceback and the fix."
    )


def quiet_interrupts() -> None:
    """An uncaught ``KeyboardInterrupt`` ends this process without a traceback, one another
    rank owns (:func:`owned_by`) with one line; every other uncaught exception is printed by
    the hook that was there (installed once)."""
    if getattr(sys.excepthook, "rankwise_quiet_interrupts", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            return
        line = follower_line(value)
        if line is not None:
            print(line, file=sys.stderr, flush=True)
        else:
            previous(kind, value, tb)

    hook.rankwise_quiet_interrupts = True  # type: ignore[attr-defined]
    sys.excepthook = hook
