"""Training on through a lost rank (``rankwise launch --on-failure continue``).

The trainer side of continue mode; the launcher side is :mod:`rankwise.launch`. Without that
launcher there is no :class:`Continuing` and the epoch loop (:mod:`rankwise.train.loop`) is
plain. Under it, the loop marks every optimizer step (:meth:`Continuing.mark`: the step, the
sampler cursor, the length of the epoch's sums) and, when a collective
fails because a peer is gone (closed gloo connection, collective timeout):

1. drops its references to the broken group (the DDP wrapper) and the partial step (gradients
   zeroed, the micro-batches after the mark taken out of the sums);
2. regroups with the survivors (:meth:`rankwise.distributed.membership.Membership.regroup`:
   same processes, a new gloo group);
3. agrees on the optimizer step: a collective can end on one survivor and fail on another,
   so their marks can be one step apart, and the ones behind take the furthest one's state
   (:func:`catch_up`). Survivors lost between two epochs' steps (the epoch's figures, its
   save) agree in the same all-gather whether the section they stopped in is done or done
   again (:mod:`rankwise.train.closings`). Then it re-wraps the module for the new group (DDP
   makes the parameters identical there);
4. re-splits the rest of the epoch from the mark's cursor over the new world, keeping the
   global batch (``3 x 32 = 96`` becomes ``2 x 48``), so the steps that follow see the same
   samples, with the same mean gradient, as the uninterrupted run. A world that does not
   divide the global batch (``3 x 5 = 15`` on 2 ranks) takes each global micro-batch in
   shares that differ by at most one (``8 + 7``,
   :class:`~rankwise.data.shares.GlobalBatchShares`) and each rank's loss is weighted by
   its share (``b_r x world / global``) so DDP's average is still the global mean; only a
   world larger than the global micro-batch (a rank without a sample) is refused
   (:func:`check_split`);
5. tells the callbacks (``on_regroup``: the :class:`~rankwise.train.audit.AuditLog` starts a
   new attempt from the mark's step, which rolls back the lost step's records) and goes on.

A lost rank the launcher restarted comes back at a step boundary: every ``N`` optimizer steps
(``RANKWISE_JOIN_CHECK_EVERY``, 1; 0 under ``--max-restarts 0``) rank 0 reads the store's
waiting list and broadcasts one number, so all members agree on the step. There they
regroup with the joiners (``regroup(grow=True)``), a live member sends its whole
:class:`TrainState` (:func:`~rankwise.train.state.broadcast_state`), and everyone re-wraps and
re-splits the rest of the epoch over the larger world, keeping the global batch (in uneven
shares where the grown world does not divide it). The joiner
ran its script's set-up alone (a world of one) and takes the state in :class:`Continuing`,
before its first epoch; its epoch sums start empty there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import textwrap
from typing import Any

import torch
import torch.distributed as dist

import rankwise.distributed as rd
from rankwise.distributed.contract import Keys
from rankwise.distributed.membership import Membership, RegroupError
from rankwise.distributed.signing import SignedStore
from rankwise.parallel import unwrap_model
from rankwise.train.closings import STEPS, Closings, Position
from rankwise.train.config import DistributedTrainingConfig
from rankwise.train.data import TrainBatches
from rankwise.train.setup import rewrap
from rankwise.train.state import TrainState, broadcast_state
from rankwise.train.sums import EpochSums, SumsLength

_log = logging.getLogger(__name__)

__all__ = [
    "Continuing",
    "JoinersWaiting",
    "Mark",
    "RecoveryCap",
    "catch_up",
    "check_split",
    "fits",
    "lost_slots",
    "shares_text",
]


def fits(global_batch: int, world: int, accum: int) -> bool:
    """Whether each of ``world`` ranks gets at least one sample of every micro-step's global
    batch (``global_batch / accum``); the shares may differ by one.

    >>> fits(15, 2, 1), fits(24, 5, 1), fits(8, 5, 2)
    (True, True, False)
    """
    return world <= global_batch // accum


def check_split(global_batch: int, world: int, accum: int, which: str) -> None:
    """Refuse a world that leaves a rank without a sample in a micro-step (``which``: "left"
    after a failure, "now" after joiners came in). A world that does not divide the global
    batch is fine: its ranks take shares that differ by at most one, the loss weighted."""
    if not fits(global_batch, world, accum):
        micro = global_batch // accum
        raise RegroupError(
            f"the global batch {global_batch} ({accum} accumulation step(s) of {micro} "
            f"samples) cannot give each of the {world} rank(s) {which} a sample per step: "
            f"the job stops. Raise batch_size so that batch_size x nproc (the samples of one "
            f"accumulation step) is at least {world}."
        )


def shares_text(global_batch: int, world: int, accum: int) -> str:
    """How ``world`` ranks share ``global_batch`` per optimizer step, as the log line says it.

    >>> shares_text(24, 2, 1), shares_text(15, 2, 1), shares_text(30, 4, 2)
    ('2 x 12', '1 x 8 + 1 x 7', '3 x 8 + 1 x 6')
    """
    base, extra = divmod(global_batch // accum, world)
    if not extra:
        return f"{world} x {global_batch // world}"
    return f"{extra} x {(base + 1) * accum} + {world - extra} x {base * accum}"


class RecoveryCap:
    """Bounds the recoveries in a row with no optimizer step between them. Each one that is
    real removes a member (or a joiner lost on its way in), and a world never holds more than
    the launched ``limit`` processes, so more than ``limit`` in a row is a loop (a failure
    taken for a lost peer, again and again): the job stops, naming the bound.

    >>> cap = RecoveryCap(2)
    >>> cap.count(5); cap.count(5); cap.count(6); cap.count(6)  # a step between: counted anew
    >>> cap.count(6)
    Traceback (most recent call last):
    ...
    rankwise.distributed.membership.RegroupError: 3 recoveries in a row at optimizer step 6 ...
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.step: int | None = None
        self.in_a_row = 0

    def count(self, step: int) -> None:
        """One more recovery back to optimizer ``step``; refused past the bound."""
        if step != self.step:
            self.step, self.in_a_row = step, 0
        self.in_a_row += 1
        if self.in_a_row > self.limit:
            raise RegroupError(
                f"{self.in_a_row} recoveries in a row at optimizer step {step} without a step "
                f"between them, more than the {self.limit} the launched world can lose "
                "(one member each): the job stops rather than regroup in a loop. The errors "
                "that made each one are above; fix that failure, or run with --on-failure "
                "restart."
            )


def lost_slots(store: SignedStore, old: list[int], members: list[int]) -> str:
    """Which slots a regroup left out (``old``: the members before it, in rank order), each
    with its rank before and how it ended, as the launcher recorded it in the job's signed
    store (``exit/<slot>/<incarnation>``: ``ended with <its exit>``, or
    :data:`~rankwise.distributed.contract.LEFT_OUT` where the launcher ended it); one with no
    exit recorded stopped answering.

    >>> store = SignedStore(dist.HashStore(), "ab" * 16, job="j1")
    >>> store.set("member/2", "0"); store.set("exit/2/0", "ended with signal SIGKILL")
    >>> lost_slots(store, [0, 1, 2], [0]), lost_slots(store, [0, 1], [0, 1])
    ('slot 1 (rank 1) stopped answering (no exit seen: frozen, stalled or on a lost node), slot 2 (rank 2) ended with signal SIGKILL', 'none left (every member regrouped)')
    >>> store.set("exit/2/1", "ended with signal SIGTERM"); store.set("dead/2", "1")  # its restart, lost
    >>> lost_slots(store, [0, 2], [0])
    'slot 2 (rank 1) ended with signal SIGTERM'

    """
    said = []
    for rank, slot in enumerate(old):
        if slot in members:
            continue
        ended = None
        with contextlib.suppress(Exception):  # a lost store: what is known is said
            # The newest start the launcher saw end, where it is the member's or a later one
            # (a restart let in and lost on its way, before it wrote member/<slot>).
            inc = store.get_int(Keys.member(slot)) or 0
            dead = store.get_int(Keys.dead(slot))
            ended = store.get(Keys.exit(slot, max(inc, dead if dead is not None else inc)))
        how = ended or "stopped answering (no exit seen: frozen, stalled or on a lost node)"
        said.append(f"slot {slot} (rank {rank}) {how}")
    return ", ".join(said) or "none left (every member regrouped)"


class JoinersWaiting(Exception):  # a signal, not an error
    """Raised at the step boundary where the members agreed to let joiners in."""


@dataclasses.dataclass
class Mark:
    """Where training is at a step boundary: a lost peer rolls back to here."""

    step: int
    cursor: dict[str, Any] | None
    sums: SumsLength | None


def catch_up(state: TrainState, mark: Mark, reason: str, closings: Closings | None = None) -> Mark:
    """Where every survivor of a regroup goes on from (``mark``: its own; a collective on the
    new group): its own mark, or the furthest survivor's. The same all-gather carries each
    survivor's :class:`~rankwise.train.closings.Position` (``closings``: this rank's), which
    decides whether a rank that stopped between two epochs' steps goes past its section or
    does it again (:func:`~rankwise.train.closings.after_regroup`).

    A collective can end on one rank and fail on another: in a ring all-reduce a rank
    that already received every chunk returns while a peer still waiting for the lost
    rank's fails. So the survivors' marks can be one optimizer step apart; that step's
    gradient held every rank's share (its samples were trained, once, and recorded), so
    the ones behind take the furthest one's model, optimizer, scheduler, precision and
    cursor, and keep their own sums and random stream. (Those sums miss their share of
    that step's losses, as the epoch's figures miss the lost rank's: the weights and the
    samples stay exact.)"""
    position = closings.position if closings is not None else Position(state.epoch, STEPS)
    gathered = rd.all_gather_plain([int(mark.step), *position])  # no peer's pickle
    steps = [int(got[0]) for got in gathered]
    if closings is not None:
        closings.regrouped([Position(*map(int, got[1:])) for got in gathered], rd.get_rank())
    furthest = max(steps)
    if min(steps) == furthest:
        return mark
    if furthest - min(steps) > 1:
        raise RegroupError(
            f"the survivors stopped at optimizer steps {steps} after {reason}: more than "
            "one step apart, which no lost peer explains (every step needs every rank's "
            "gradient). The job stops; relaunch with resume='auto' from the last checkpoint."
        )
    src = steps.index(furthest)
    got = _state_of(state, src, {"cursor": mark.cursor})
    if mark.step == furthest:
        return mark
    _adopt(state, got, f"rank {src}'s state at optimizer step {furthest}", state.sums)
    return Mark(furthest, got["continue"]["cursor"], mark.sums)


def _state_of(state: TrainState, src: int, extra: dict[str, Any]) -> dict[str, Any]:
    """Rank ``src``'s whole :class:`TrainState`, with its ``extra`` under ``"continue"``, on
    every rank of the group; a collective (the sums and the RNG states are gathered)."""
    saved = state.state_dict()
    saved["continue"] = extra
    return broadcast_state(saved if rd.get_rank() == src else None, src)


def _adopt(state: TrainState, got: dict[str, Any], source: str, sums: EpochSums | None) -> None:
    """Load another rank's state (from :func:`_state_of`) but keep ``sums`` as this rank's epoch
    sums. Its random stream stays its own: ``got`` holds every rank's of this world."""
    state.load_state_dict(got, source)
    state.sums, state.restored = sums, None


class Continuing:
    """One ``fit``'s epochs under ``--on-failure continue`` (see module doc). The epoch loop
    (:func:`rankwise.train.loop.run_epoch`) calls :meth:`begin_epoch`, :meth:`mark` after every
    step, :meth:`joiners_agreed` at step boundaries, and :meth:`recover` or :meth:`grow`
    when a step fails or joiners come in."""

    def __init__(
        self,
        membership: Membership,
        state: TrainState,
        cfg: DistributedTrainingConfig,
        device: torch.device | None,
    ) -> None:
        self.membership, self.state, self.cfg = membership, state, cfg
        self.device = device
        # The launched world's global batch, also where generation 0 formed without a rank
        # that crashed in its set-up (it comes back as a joiner).
        self.global_batch = cfg.effective_batch_size(membership.cfg.world_size)
        self.source: Any = None
        self.last_mark: Mark | None = None
        self.join_every = membership.cfg.join_check_every
        self.join_cursor: dict[str, Any] | None = None  # a joiner's, until it has the data
        self.cap = RecoveryCap(membership.cfg.world_size)
        # the collectives between two epochs' steps, each section safe to retry
        self.closings = Closings()

    @classmethod
    def for_this_job(
        cls,
        roles: rd.Roles,
        state: TrainState,
        cfg: DistributedTrainingConfig,
        device: torch.device | None,
    ) -> Continuing | None:
        """A ``Continuing`` when the job runs under ``--on-failure continue`` (``roles``: the
        fit's, :class:`rankwise.distributed.Roles`), else None."""
        if roles.membership is None:
            return None
        cfg.check_combinations(continue_mode=True)
        return cls(roles.membership, state, cfg, device)

    def join_if_waiting(self) -> bool:
        """A restarted process: wait to be let in at the members' next step boundary and take
        a live member's state. Returns whether it joined (False: an original member)."""
        if not self.membership.pending:
            return False
        self.state.sums = EpochSums()  # its own sums of the epoch start empty
        self.membership.join()
        self._take_state(None)
        self.closings.in_steps(self.state.epoch)  # the members' steps, where it joins them
        return True

    def finished(self) -> None:
        """The last epoch and its save are done: record it in the job's store, where the
        launcher looks when a process exits 0 (an exit 0 before any rank recorded it is a rank
        that left early, restarted like any lost one; docs/continue.md)."""
        self.membership.record_finished()

    def begin_epoch(self, source: Any) -> Any:
        """The epoch's batches: ``source`` (the trainer's), or this mode's re-split of it after
        a regroup; marks the epoch's start."""
        if self.source is None or self.source.dataset is not getattr(source, "dataset", None):
            if not isinstance(source, TrainBatches):
                raise RegroupError(
                    "--on-failure continue re-splits the rest of the epoch over the survivors, "
                    "which needs the trainer's own sampler: pass arrays or a Dataset to fit(), "
                    "not a DataLoader (or launch with --on-failure restart)."
                )
            self.source = source
            if self.join_cursor is None and self.membership.world_size != (
                self.membership.cfg.world_size
            ):  # generation 0 formed smaller than launched: the global batch is kept
                self._resplit(dict(source.sampler.state_dict()), self.membership.world_size)
        if self.join_cursor is not None:
            self._resplit(self.join_cursor, self.membership.world_size)
            self.join_cursor = None
        self.mark()
        self.closings.in_steps(self.state.epoch)
        return self.source

    def epoch_over(self) -> bool:
        """Whether the sampler already went through this epoch (a recovery after its last
        step, lost in the epoch's closing all-reduce): iterating it again would repeat it."""
        sampler = self.source.sampler
        return (
            sampler.epoch == self.state.epoch and sampler.consumed > 0 and sampler.remaining() == 0
        )

    def mark(self) -> None:
        """Remember where training is (a step boundary): a lost peer rolls back to here."""
        sums, sampler = self.state.sums, self.state.sampler
        cursor = dict(sampler.state_dict()) if sampler is not None else None
        length = sums.length() if sums is not None else None
        self.last_mark = Mark(self.state.step, cursor, length)

    def joiners_agreed(self) -> bool:
        """Whether every member lets the waiting joiners in now: rank 0 reads the store and
        broadcasts the answer (a world with more ranks than a micro-step has samples waits)."""
        if not self.join_every or self.state.step % self.join_every:
            return False
        flag = torch.zeros(1, dtype=torch.int64, device=rd.collective_device())
        if rd.is_master():
            world = self.membership.world_size + len(self.membership.joiners())
            holds = fits(self.global_batch, world, self.cfg.grad_accum_steps)
            flag[0] = int(world > self.membership.world_size and holds)
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    @staticmethod
    def lost_peer(exc: RuntimeError) -> str:
        """What to say of an error that means a lost or frozen peer; the rank's own error
        (:func:`rankwise.distributed.classify`) is raised: it is this rank's failure."""
        if not rd.is_peer_failure(exc):
            raise exc
        first = (str(exc).splitlines() or [""])[0]
        return f"{type(exc).__name__}: {textwrap.shorten(first, 300, placeholder=' ...')}"

    # -- recovery ---------------------------------------------------------------------------

    def recover(self, reason: str) -> None:
        """Regroup with the survivors after a lost peer and go back to the last mark."""
        state, mark = self.state, self.last_mark
        assert mark is not None and state.optimizer is not None, "set by begin_epoch / fit"
        self.cap.count(mark.step)
        module = self._unwrap()
        state.optimizer.zero_grad(set_to_none=True)  # the partial step's gradients
        # The generation it was in, also where that generation's group never formed (a
        # failure in its set-up, recovered from in turn): torch's group is gone by then.
        old_world, old_members = self.membership.world_size, list(self.membership.members)
        self.membership.regroup()
        world = self._check_split("left")
        # Before the wrap: DDP's wrap hands rank 0's parameters to every rank.
        agreed = catch_up(self.state, mark, reason, self.closings)
        state.model = rewrap(module, self.cfg, self.device)
        state.step = agreed.step
        if state.sums is not None and mark.sums is not None:
            state.sums.truncate(mark.sums)  # its own sums, to its own mark
        self._resplit(agreed.cursor, world)
        _log.debug("the error that showed the lost peer: %s", reason)
        left = lost_slots(self.membership.signed, old_members, self.membership.members)
        self._say(f"a peer was lost: {left}", old_world, agreed.step)

    def grow(self) -> None:
        """Let the waiting joiners in at this step boundary (every member, agreed)."""
        old_world = rd.get_world_size()
        self._unwrap()
        self.membership.regroup(grow=True)
        self._take_state(old_world)

    def _take_state(self, old_world: int | None) -> None:
        """After a generation that let joiners in: a live member's state on every rank (the
        joiners load it), the module wrapped for the new group, the rest of the epoch re-split
        (a joiner's once it has its data: :meth:`begin_epoch`). ``old_world``: None on a
        joiner."""
        state, m = self.state, self.membership
        src = next(r for r, slot in enumerate(m.members) if slot not in m.joined)
        got = _state_of(state, src, {"global_batch": self.global_batch})
        self.global_batch = int(got["continue"]["global_batch"])
        world = self._check_split("now")
        module = unwrap_model(state.model)
        if old_world is None:  # the joiner: the members' state, its own (empty) epoch sums
            _adopt(state, got, f"rank {src}'s state", EpochSums())
            self.join_cursor = got["sampler"]
        state.model = rewrap(module, self.cfg, self.device)
        if old_world is not None:
            self._resplit(got["sampler"], world)
        said = (
            f"slot(s) {m.joined} rejoined" if m.joined else "the joiner was lost before it came in"
        )
        # A joiner that is rank 0 of the new generation says it: the members it joined.
        self._say(
            said, len(m.members) - len(m.joined) if old_world is None else old_world, state.step
        )

    def _unwrap(self) -> torch.nn.Module:
        self.membership.arrive()  # first: the collection below starves the heartbeat thread
        module = unwrap_model(self.state.model)
        self.state.model = module  # the wrapper holds the old group: let it go
        gc.collect()
        return module

    def _check_split(self, which: str) -> int:
        world = self.membership.world_size
        check_split(self.global_batch, world, self.cfg.grad_accum_steps, which)
        return world

    def _say(self, what: str, old_world: int, step: int) -> None:
        if rd.is_master():
            world = self.membership.world_size
            print(
                f"rankwise: {what}; continuing on {world} rank(s) (was {old_world}) "
                f"from optimizer step {step}, global batch {self.global_batch} = "
                f"{shares_text(self.global_batch, world, self.cfg.grad_accum_steps)}",
                flush=True,
            )

    def _resplit(self, cursor: dict[str, Any] | None, world: int) -> None:
        old = self.source
        micro = self.global_batch // self.cfg.grad_accum_steps  # one micro-step, all ranks
        self.source = TrainBatches(
            old.dataset,
            micro // world,
            shuffle=self.cfg.shuffle,
            seed=self.cfg.seed,
            options=old.options,
            record_ids=old.record_ids,
            global_batch=micro,  # shares that differ by one where the world does not divide it
        )
        if cursor is not None:
            self.source.sampler.load_state_dict(cursor)
        self.state.sampler = self.source.sampler
