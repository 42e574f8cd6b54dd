"""Ctrl-C under ``rankwise launch``: a rank ends quietly, its launcher says what happened.

A terminal's Ctrl-C reaches every process of the job (``--on-failure continue``: the ranks share
the launcher's process group) or is forwarded to them (torchrun's agent sends each rank the
SIGINT it got). Each rank then raises ``KeyboardInterrupt`` wherever it is, and the peers of the
first to end fail in their collective: N tracebacks that say nothing but "interrupted", before
the launcher's one line. Under the launcher, :func:`quiet_interrupts` keeps the interrupt itself
(a script's ``except KeyboardInterrupt`` and ``finally`` blocks run as ever, and the process
still ends by SIGINT) and only drops the traceback of one that ends the process.
"""

from __future__ import annotations

import sys
from types import TracebackType

__all__ = ["quiet_interrupts"]


def quiet_interrupts() -> None:
    """An uncaught ``KeyboardInterrupt`` ends this process without a traceback; every other
    uncaught exception is printed by the hook that was there (installed once)."""
    if getattr(sys.excepthook, "rankwise_quiet_interrupts", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            previous(kind, value, tb)

    hook.rankwise_quiet_interrupts = True  # type: ignore[attr-defined]
    sys.excepthook = hook
