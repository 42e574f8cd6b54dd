"""Who this process is in its job, for the code that acts by role: one object, built once.

Outside ``rankwise launch --on-failure continue`` a process keeps its role for the whole job:
rank ``r`` is rank ``r`` from start to end, rank 0 writes the shared checkpoints. Under it roles
move: a regroup makes another process rank 0 (the writer), a restarted process waits to join
(and must not resume, log or name an audit attempt meanwhile), and a process's own folder is
its *slot*'s, not its rank of the moment. The code that acts by role (the checkpoint folder,
resume, the background writer, the audit log) asks a :class:`Roles`, which ``fit`` builds once
(:meth:`Roles.for_this_process`) and hands to each of them, instead of each reading the
process's membership (``rd.membership()``) on its own.

A :class:`Roles` answers live (it holds the process's
:class:`~rankwise.distributed.membership.Membership`, whose generation moves on), and holds no
state of its own.

>>> roles = Roles(None)  # outside continue mode
>>> roles.continuing, roles.joining, roles.writer_now()
(False, False, None)
"""

from __future__ import annotations

from rankwise.distributed.group import get_rank, is_master, membership
from rankwise.distributed.membership import Membership

__all__ = ["Roles"]


class Roles:
    """This process's roles in its job (see the module doc); ``membership``: its continue-mode
    membership, or None outside that mode."""

    def __init__(self, membership: Membership | None) -> None:
        self.membership = membership

    @classmethod
    def for_this_process(cls) -> Roles:
        """The roles of this process, as :func:`rankwise.distributed.init` set it up (the one
        read of ``rd.membership()`` that ``fit`` makes)."""
        return cls(membership())

    @property
    def continuing(self) -> bool:
        """Under ``--on-failure continue``: any process may become rank 0 (the writer)."""
        return self.membership is not None

    @property
    def joining(self) -> bool:
        """A restarted process still waiting to be let in (it gets a live peer's state, so it
        resumes nothing, logs nothing and starts no audit attempt until it is in)."""
        return self.membership is not None and self.membership.pending

    @property
    def slot(self) -> int:
        """Whose per-rank folder this process writes: its slot under continue mode (a
        restarted slot 2 writes ``rank-2/`` again, not ``rank-0/`` of its world of one), else
        its rank."""
        return self.membership.cfg.slot if self.membership is not None else get_rank()

    @property
    def nnodes(self) -> int:
        """The nodes the continue job runs on (1 outside continue mode)."""
        return self.membership.cfg.nnodes if self.membership is not None else 1

    def writes_shared(self) -> bool:
        """Whether this process writes the checkpoints rank 0 alone writes, now (rank 0 moves
        under continue mode; a process waiting to join is not the master)."""
        return is_master()

    def writer_now(self) -> tuple[int, int] | None:
        """``(generation, slot of rank 0)`` under continue mode, else None: who writes now."""
        m = self.membership
        return None if m is None else (m.generation, m.members[0])

    def writer_left_out(self, written_in: tuple[int, int] | None) -> bool:
        """Whether a generation after ``written_in`` (:meth:`writer_now` when a write started)
        left that writer out: it was lost, and its write may never have landed."""
        m = self.membership
        if m is None or written_in is None:
            return False
        gen, slot = written_in
        return any(slot not in m.history.get(g, [slot]) for g in range(gen + 1, m.generation + 1))

    def stop_joiners(self, why: str) -> None:
        """Every member stops the job with ``why``: a process waiting to join (now or later)
        gives up at once, naming it. Nothing to do outside continue mode or on a joiner."""
        if self.membership is not None and not self.membership.pending:
            self.membership.stop(why)

    def member(self) -> tuple[int, int, int] | None:
        """``(slot, incarnation, generation)``: who this is across regroups and restarts (the
        audit timeline's rows); None outside continue mode."""
        m = self.membership
        return None if m is None else (m.cfg.slot, m.cfg.incarnation, m.generation)
