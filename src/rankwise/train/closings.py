"""The collectives between one epoch's last step and the next epoch's first, made safe to
retry after a lost peer (``rankwise launch --on-failure continue``).

After an epoch's last optimizer step come its *closing sections*, each a short run of
collectives: the epoch's figures (one all-reduce of the sums), then the epoch's checkpoint
save (:func:`rankwise.train.loop.between_epochs`), and after the last epoch the end of fit's
save. A collective is not atomic when a peer dies in it: it can return on one survivor and
fail on another (gloo's all-reduce returns on a rank that already has every chunk while a peer
still waiting for the lost rank's fails). Were the first survivor to go on, it would be in the
next section while the other retries this one, and their next collectives would not match (a
one-element int64 flag meets a four-element float64 sum: garbage, then a hang or an error).

So each section is done in two phases: its work, then a barrier, the commit. Where a survivor
stopped is its :class:`Position`: in the steps of an epoch, or in a section with its work done
or not. After a regroup the survivors gather their positions (in the same all-gather as
:func:`rankwise.train.continuing.catch_up`'s optimizer steps) and :func:`after_regroup`
decides, identically on every rank:

- every survivor did the section's work (some failed at its barrier, maybe some passed it):
  the section is done, and the ones still in it go on with their own result;
- some did not: every survivor in the section does it again from its start, what it reads
  restored to what it was at the first start (:meth:`Closings.run`'s ``keep``: the
  checkpointer's choices, which checkpoint is due and which write is in flight), so each rank
  takes the same branches and makes the same collectives.

A collective ends on no rank unless every rank entered it, so survivors are never more than
one collective apart: a position spread that this does not explain stops the job with a
:class:`~rankwise.distributed.membership.RegroupError` instead of mismatched collectives.

>>> after_regroup([Position(1, FIGURES, DONE), Position(1, SAVE, WORKING)], 0)
True
>>> after_regroup([Position(1, FIGURES, DONE), Position(1, FIGURES, WORKING)], 0)
False
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import rankwise.distributed as rd
from rankwise.distributed.membership import RegroupError

__all__ = [
    "DONE",
    "END",
    "FIGURES",
    "SAVE",
    "STEPS",
    "WORKING",
    "Closings",
    "Keeps",
    "Position",
    "after_regroup",
]

T = TypeVar("T")

# Where in an epoch, in the order they come: its steps, its figures, its save; after the last
# epoch, the end of fit's save.
STEPS, FIGURES, SAVE, END = 0, 1, 2, 3
STAGES = ("steps", "figures", "save", "end of fit")
# Within a section: its work running, its work done (at the barrier), the barrier passed.
WORKING, DONE, COMMITTED = 0, 1, 2
PHASES = ("working", "work done", "committed")


class Keeps(Protocol):
    """What a section's retry restores (the checkpointer: which save is due, which in
    flight): :meth:`snapshot` at its first start, :meth:`restore` before each retry."""

    def snapshot(self) -> Any: ...

    def restore(self, snapshot: Any) -> None: ...


class Position(NamedTuple):
    """Where a rank stopped: ``(epoch, stage, phase)``, ordered as training goes."""

    epoch: int
    stage: int  # STEPS, FIGURES, SAVE or END
    phase: int = WORKING  # WORKING, DONE or COMMITTED (a section's; STEPS: always WORKING)

    def describe(self) -> str:
        where = f"epoch {self.epoch}'s {STAGES[self.stage]}"
        return where if self.stage == STEPS else f"{where} ({PHASES[self.phase]})"


def _follows(first: tuple[int, int], then: tuple[int, int]) -> bool:
    """Whether section ``then`` (epoch, stage) can come right after ``first``."""
    (e, stage), (e2, stage2) = first, then
    if stage == STEPS:
        return (e2, stage2) == (e, FIGURES)
    if stage == FIGURES:
        return (e2, stage2) == (e, SAVE)
    if stage == SAVE:
        return (e2, stage2) in ((e, END), (e + 1, STEPS))
    return False  # the end of fit: nothing comes after it


def after_regroup(positions: list[Position], rank: int) -> bool:
    """Whether rank ``rank`` of the regrouped survivors (``positions``: every one's, in rank
    order) goes past the section it stopped in, with its own result (True), or does it again
    (False: also a rank in an epoch's steps, which :func:`~rankwise.train.continuing.catch_up`
    settles). The same answer for a section on every rank in it; raises
    :class:`RegroupError` for positions that no single lost peer explains."""
    keys = sorted({(p.epoch, p.stage) for p in positions})
    mine = positions[rank]
    if any(p.phase == COMMITTED for p in positions):  # past a barrier, in no section yet:
        raise _unexplained(positions)  # no recovered collective runs there (validation)
    if len(keys) == 1:
        # One section: done once every survivor has done its work (the barrier's failure
        # alone left them there); else all do it again (the steps: catch_up's business).
        return mine.stage != STEPS and all(p.phase >= DONE for p in positions)
    first, then = keys[0], keys[-1]
    behind = [p for p in positions if (p.epoch, p.stage) == first]
    ahead = [p for p in positions if (p.epoch, p.stage) == then]
    explained = len(keys) == 2 and _follows(first, then)
    if first[1] == STEPS:  # a step behind the others' first figures collective: catch_up
        explained = explained and all(p.phase == WORKING for p in ahead)
    else:  # those ahead passed the barrier: every survivor had done the work; they are in
        # the next section (at its barrier already where its work made no collective)
        explained = explained and all(p.phase >= DONE for p in behind)
        explained = explained and all(p.phase <= DONE for p in ahead)
    if not explained:
        raise _unexplained(positions)
    return first[1] != STEPS and (mine.epoch, mine.stage) == first


def _unexplained(positions: list[Position]) -> RegroupError:
    said = ", ".join(f"rank {r}: {p.describe()}" for r, p in enumerate(positions))
    return RegroupError(
        f"the survivors of a regroup stopped in places that no lost peer explains ({said}): "
        "their next collectives would not match. The job stops; relaunch with "
        "resume='auto' from the last checkpoint."
    )


@dataclass
class _Section:
    key: tuple[int, int]
    kept: Any  # what keep.snapshot() said at its first start
    result: Any = None
    done: bool = False  # its work is done (maybe not its barrier)


class Closings:
    """This rank's closing sections under continue mode (see module doc): :meth:`run` runs one,
    :attr:`position` says where the rank is, :meth:`regrouped` takes the survivors'
    decision."""

    def __init__(self) -> None:
        self.position = Position(0, STEPS)
        self._section: _Section | None = None
        self._past = False  # after_regroup: the section this rank stopped in is done

    def in_steps(self, epoch: int) -> None:
        """The rank trains epoch ``epoch``'s steps now."""
        self.position, self._past = Position(epoch, STEPS), False

    def regrouped(self, positions: list[Position], rank: int) -> None:
        """The survivors' positions, gathered after a regroup: decide this rank's next move."""
        self._past = after_regroup(positions, rank)

    def run(
        self,
        epoch: int,
        stage: int,
        work: Callable[[], T],
        keep: Keeps | None = None,
        *,
        commit: bool = True,
    ) -> T:
        """Section ``(epoch, stage)``: ``work()`` (its collectives), then a barrier (unless
        ``commit`` is False: nothing can follow it on another rank); returns work's result.
        Called again after a regroup it either returns the result this rank already has (the
        survivors agreed the section is done) or restores ``keep`` and does the work again."""
        key, section = (epoch, stage), self._section
        if section is not None and section.key == key and self._past and section.done:
            self._past, self.position = False, Position(epoch, stage, COMMITTED)
            return section.result
        if section is None or section.key != key:
            section = self._section = _Section(key, None if keep is None else keep.snapshot())
        elif keep is not None:
            keep.restore(section.kept)  # a retry: the same choices as at the first start
        self._past, section.done = False, False
        self.position = Position(epoch, stage, WORKING)
        section.result = work()
        section.done, self.position = True, Position(epoch, stage, DONE)
        if commit:
            rd.barrier()
        self.position = Position(epoch, stage, COMMITTED)
        return section.result
