"""Break a training run on purpose, and check what it trained: fault injection for tests.

:func:`kill_at_checkpoint` SIGKILLs a process at a chosen point of a checkpoint save;
:func:`assert_exactly_once` reads a run's sample audit and asserts every sample of every epoch
was trained exactly once across its attempts.
"""

from __future__ import annotations

import os
import signal

__all__ = ["assert_exactly_once", "kill_at_checkpoint"]


def kill_at_checkpoint(point: str, after: int = 0) -> None:
    """SIGKILL this process at ``point`` of a checkpoint save, for fault-injection tests.

    ``point`` is one of :data:`rankwise.train.checkpoint.FAULT_POINTS` (``"mid-write"``,
    ``"before-rename"``, ``"before-manifest"``, ``"before-pointer"``, ``"before-prune"``);
    the first ``after`` passes through it are let go. Call it inside the process to kill (a
    rank, a child script); ``rankwise.train.checkpoint.set_fault_hook(None)`` undoes it.
    """
    from rankwise.train.checkpoint import FAULT_POINTS, set_fault_hook

    if point not in FAULT_POINTS:
        raise ValueError(
            f"point ({point!r}) is not a checkpoint fault point; use one of {FAULT_POINTS}."
        )
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValueError(f"after ({after!r}) must be an integer >= 0.")
    remaining = [after]

    def hook(name: str) -> None:
        if name != point:
            return
        if remaining[0] > 0:
            remaining[0] -= 1
            return
        os.kill(os.getpid(), signal.SIGKILL)

    set_fault_hook(hook)


def assert_exactly_once(
    audit_dir: str | os.PathLike[str], attempts: int, num_samples: int, epochs: int
) -> list[int]:
    """Assert a run's sample audit (``rankwise.train.read_audit``) shows ``attempts`` attempts
    (the first start plus each restart) and every sample of each epoch trained exactly once;
    return each attempt's start step, e.g. ``[0, 6]`` for one restart from step 6.
    """
    from rankwise.train import read_audit

    report = read_audit(audit_dir)
    assert len(report.attempts) == attempts, [a.name for a in report.attempts]
    assert report.violations(num_samples, epochs) == []
    return [a.start_step for a in report.attempts]
