"""The continue-mode launcher's decisions on its processes' exits, as a pure function of what
it saw: :class:`Ledger` (``rankwise.launch.supervisor`` feeds it every exit in order and carries
out its :class:`Verdict`), so the contract "exit 0 only when training finished; every failed
slot with restarts left is restarted; every failed exit named" is tested on its own
(tests/launch/test_launch_exit_decisions.py)."""

from __future__ import annotations

import contextlib
import signal
from dataclasses import dataclass, field

__all__ = ["Ledger", "Verdict", "describe_exit"]


@dataclass(frozen=True)
class Verdict:
    """What the launcher does about one process's exit: ``action`` is ``"restart"``,
    ``"lost"`` (the slot has no process any more), ``"done"`` (it exited 0 with training
    finished), ``"failed"`` (it failed after training finished: the job's exit code is
    its) or ``"ended"`` (the launcher ended it: a joiner nobody lets in any more); ``message``
    the line said about it (None: nothing to say)."""

    action: str
    message: str | None = None


@dataclass
class Ledger:
    """The launcher's decisions on its slots' exits, a pure function of what it saw (the
    supervising loop feeds it every exit in order and carries its verdicts out).

    The contract (docs/continue.md, "When the job is done"): training has finished once a
    rank recorded that its ``fit`` completed (:mod:`rankwise.distributed.finish`), here or on
    another node. Until then every exit, 0 included, is a lost slot: restarted while it has
    restarts left (``--max-restarts`` per slot) and the store is there, and said either way.
    After it, a process that exits non-zero, unless the launcher ended it, failed in its work
    after ``fit``: said, and the job's exit code is its. The exit code (:meth:`code`) is 0
    only when training finished and nothing failed after.

    >>> ledger = Ledger(slots=[0, 1], restarts=1)
    >>> ledger.exited(1, 0, finished=False).message
    'slot 1 exited with exit code 0 before training finished (no rank has completed fit); restarting it (1/1)'
    >>> ledger.exited(0, 0, finished=True).action, ledger.code()
    ('done', 0)
    """

    slots: list[int]
    restarts: int
    finished: bool = False
    incarnations: dict[int, int] = field(default_factory=dict)
    codes: list[int] = field(default_factory=list)  # every exit, in order
    failed_after: list[tuple[int, int]] = field(default_factory=list)  # (slot, code)

    def __post_init__(self) -> None:
        self.incarnations = {slot: self.incarnations.get(slot, 0) for slot in self.slots}

    def finish(self) -> None:
        """Training finished (a rank recorded it, on any node)."""
        self.finished = True

    def exited(
        self, slot: int, code: int, *, finished: bool, store_lost: bool = False,
        ended: bool = False,
    ) -> Verdict:  # fmt: skip
        """Slot ``slot``'s process exited with ``code`` (negative: the signal's number);
        ``finished``: a rank had recorded that training finished when it did; ``ended``: the
        launcher ended it itself."""
        self.codes.append(code)
        self.finished = self.finished or finished
        said = describe_exit(code)
        if self.finished:
            if code == 0:
                return Verdict("done")
            if ended:
                return Verdict("ended")
            self.failed_after.append((slot, code))
            return Verdict(
                "failed",
                f"slot {slot} exited with {said} after training finished (its work after "
                "fit failed; the error is above); the job's exit code will be non-zero",
            )
        if code == 0:
            said += " before training finished (no rank has completed fit)"
        incarnation = self.incarnations[slot]
        if store_lost:
            return Verdict(
                "lost", f"slot {slot} exited with {said}; not restarted: the membership "
                "store is lost",
            )  # fmt: skip
        if incarnation >= self.restarts:
            return Verdict(
                "lost", f"slot {slot} exited with {said} and has no restarts left "
                f"(--max-restarts {self.restarts})",
            )  # fmt: skip
        self.incarnations[slot] = incarnation + 1
        return Verdict(
            "restart", f"slot {slot} exited with {said}; restarting it "
            f"({incarnation + 1}/{self.restarts})",
        )  # fmt: skip

    def code(self) -> int:
        """The launcher's exit code once none of its processes runs: 0 only when training
        finished and no process failed after; else the first failure's (1 where none is
        positive: a signal, or exits 0 before training finished)."""
        if self.finished and not self.failed_after:
            return 0
        codes = [c for _, c in self.failed_after] if self.finished else self.codes
        return next((c for c in codes if c > 0), 1)


def describe_exit(code: int) -> str:
    """``exit code 1`` or ``signal SIGKILL`` (a negative code: the signal that ended it)."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"
