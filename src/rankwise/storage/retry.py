"""Bounded retries with exponential backoff for transient storage faults (:class:`RetryPolicy`,
:func:`retrying`); what counts as transient is :func:`~rankwise.storage.errors.classify`'s."""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from typing import TypeVar

from rankwise.storage.errors import FIXES, StorageError, StorageWarning, classify

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How often a transient failure is retried: ``attempts`` tries in all, waiting
    ``first_delay * 2**i`` seconds (at most ``max_delay``) after the ``i``-th failure.

    >>> RetryPolicy(attempts=4, first_delay=0.5, max_delay=1.0).delays()
    [0.5, 1.0, 1.0]
    """

    attempts: int = 5
    first_delay: float = 0.5
    max_delay: float = 8.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ValueError(f"attempts ({self.attempts!r}) must be an integer >= 1.")
        if self.attempts < 1:
            raise ValueError(f"attempts ({self.attempts}) must be >= 1 (1: no retry).")
        if not 0 <= self.first_delay <= self.max_delay:
            raise ValueError(
                f"first_delay ({self.first_delay}) and max_delay ({self.max_delay}) must "
                "satisfy 0 <= first_delay <= max_delay (seconds)."
            )

    def delays(self) -> list[float]:
        """The waits between the attempts, in order."""
        return [min(self.first_delay * 2**i, self.max_delay) for i in range(self.attempts - 1)]


def retrying(
    op: Callable[[], T],
    *,
    what: str,
    url: str,
    policy: RetryPolicy,
    scrub: Callable[[str], str] = lambda text: text,
    sleep: Callable[[float], None] = time.sleep,
    announce: Callable[[str], None] | None = None,
) -> T:
    """``op()``, retried under ``policy`` while it fails transiently (see :func:`classify`),
    each retry announced by a :class:`StorageWarning` naming ``what`` (an operation and its
    URL), or by ``announce(message)`` when given (a storage that warns once per outage).
    Gives up with :class:`StorageError` naming ``what``, the cause and the fix; a missing
    object raises ``FileNotFoundError`` naming it, at once. ``scrub`` cleans every message."""
    delays = policy.delays()
    for attempt in range(policy.attempts):
        try:
            return op()
        except Exception as e:
            kind = classify(e)
            cause = scrub(f"{type(e).__name__}: {e}")
            if kind == "unreachable" and attempt < len(delays):
                message = (
                    f"{what} failed ({cause}); retrying in {delays[attempt]:.1f} s (attempt "
                    f"{attempt + 2} of {policy.attempts})."
                )
                if announce is not None:
                    announce(message)
                else:
                    warnings.warn(message, StorageWarning, stacklevel=4)
                sleep(delays[attempt])
                continue
            if kind == "not-found":
                raise FileNotFoundError(f"{what.split(' ')[-1]} does not exist.") from None
            tries = f" after {policy.attempts} attempts" if policy.attempts > 1 else ""
            # from None: the chained backend exceptions are not scrubbed
            raise StorageError(
                f"{what} failed{tries}: {cause.rstrip('.')}. Fix: {FIXES[kind]}.",
                url=url,
                reason=kind,
            ) from None
    raise AssertionError("unreachable")  # the last attempt returns or raises
