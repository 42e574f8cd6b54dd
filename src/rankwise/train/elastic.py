"""Training on through a lost rank (``rankwise launch --on-failure continue``).

Without that launcher :func:`epoch_runner` is :func:`~rankwise.train.loop.train_epoch` itself.
Under it, each epoch runs inside :class:`Continuing`, which keeps a *mark* at every optimizer
step (the step, the sampler cursor, the length of the epoch's sums) and, when a collective
fails because a peer is gone (closed gloo connection, collective timeout):

1. drops its references to the broken group (the DDP wrapper) and the partial step (gradients
   zeroed, the micro-batches after the mark taken out of the sums);
2. regroups with the survivors (:meth:`rankwise.distributed.membership.Membership.regroup`:
   same processes, a new gloo group);
3. re-wraps the module for the new group and checks every survivor is at the same optimizer
   step (DDP makes their parameters identical there);
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

>>> epoch_runner(None, None, None, lambda: None) is train_epoch   # no membership: plain
True
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import rankwise.distributed as rd
from rankwise.distributed.membership import Membership, RegroupError
from rankwise.parallel import unwrap_model
from rankwise.train.config import DistributedTrainingConfig
from rankwise.train.config_checks import check_continue_strategy
from rankwise.train.loop import StepEnv, train_epoch
from rankwise.train.pipeline import TrainBatches
from rankwise.train.setup import rewrap
from rankwise.train.state import TrainState, broadcast_state
from rankwise.train.sums import EpochSums

__all__ = [
    "Continuing", "check_split", "closing", "epoch_runner", "fits", "is_peer_failure",
    "shares_text",
]  # fmt: skip

EpochFn = Callable[[TrainState, StepEnv, Any], tuple[float, float | None, int]]

# What gloo and c10d say when a peer is gone: a closed or reset connection, or the
# collective timeout (a frozen peer).
_PEER_GONE = (
    "closed by peer",
    "connection reset",
    "broken pipe",
    "timed out",
    "timeout",
    "connection refused",
    "socket",
)


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


class _Grow(Exception):  # a signal, not an error
    """Raised at the step boundary where the members agreed to let joiners in."""


def is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (from a collective) says a peer is gone, not that the code is wrong.

    >>> is_peer_failure(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]"))
    True
    >>> is_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    False
    """
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(word in text for word in _PEER_GONE)


def _lost_peer(exc: RuntimeError) -> str:
    """What to say of a collective's error that means a lost peer; any other is raised."""
    if not is_peer_failure(exc):
        raise exc
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def epoch_runner(
    state: TrainState | None,
    cfg: DistributedTrainingConfig | None,
    device: torch.device | None,
    notify: Callable[[], None],
) -> EpochFn:
    """``train_epoch``, or a :class:`Continuing` one under ``--on-failure continue``."""
    membership = rd.membership()
    if membership is None or state is None or cfg is None:
        return train_epoch
    check_continue_strategy(cfg.strategy)
    return Continuing(membership, state, cfg, device, notify).run_epoch


def closing(run: EpochFn, what: Callable[[], None]) -> None:
    """``what()`` between epochs or after the last (a checkpoint save, the wait for the last
    one); under ``--on-failure continue`` (``run`` from :func:`epoch_runner`), a peer lost in
    it is recovered from as in an epoch and ``what`` runs again in the new group."""
    owner = getattr(run, "__self__", None)
    if isinstance(owner, Continuing):
        owner.closing(what)
    else:
        what()


@dataclasses.dataclass
class _Mark:
    step: int
    cursor: dict[str, Any] | None
    sums: tuple[int, int, int, int]  # lengths of losses, counts, hits; classed


class Continuing:
    """One ``fit``'s epochs under ``--on-failure continue`` (see module doc)."""

    def __init__(
        self,
        membership: Membership,
        state: TrainState,
        cfg: DistributedTrainingConfig,
        device: torch.device | None,
        notify: Callable[[], None],
    ) -> None:
        self.membership, self.state, self.cfg = membership, state, cfg
        self.device, self.notify = device, notify
        self.global_batch = cfg.batch_size * rd.get_world_size() * cfg.grad_accum_steps
        self.source: Any = None
        self.mark: _Mark | None = None
        self.regroups = 0
        self.join_every = membership.cfg.join_check_every
        self.join_cursor: dict[str, Any] | None = None  # a joiner's, until it has the data
        if membership.pending:  # a restarted process: in at the members' next step boundary
            state.sums = EpochSums()  # its own sums of the epoch start empty
            membership.join()
            self._take_state(None)

    def run_epoch(self, state: TrainState, env: StepEnv, source: Any) -> tuple:
        """``train_epoch`` until it finishes, regrouping after each lost peer."""
        if self.source is None or self.source.dataset is not getattr(source, "dataset", None):
            if not isinstance(source, TrainBatches):
                raise RegroupError(
                    "--on-failure continue re-splits the rest of the epoch over the survivors, "
                    "which needs the trainer's own sampler: pass arrays or a Dataset to fit(), "
                    "not a DataLoader (or launch with --on-failure restart)."
                )
            self.source = source
        if self.join_cursor is not None:
            self._resplit(self.join_cursor, self.membership.world_size)
            self.join_cursor = None
        env = dataclasses.replace(env, after_step=self._marking(env.after_step))
        self.mark = self._take_mark()
        while True:
            try:
                if self._epoch_over(state):  # lost in the epoch's closing all-reduce
                    assert state.sums is not None, "set by fit()"
                    return state.sums.result()
                return train_epoch(state, env, self.source)
            except _Grow:
                reason = ""
            except RuntimeError as exc:
                reason = _lost_peer(exc)
            # Outside the except block: the traceback's frames hold the DDP wrapper, and so
            # the broken group, whose sockets must close for blocked peers to wake up.
            if reason:
                self._recover(reason)
            else:
                self._grow()

    def closing(self, what: Callable[[], None]) -> None:
        """See :func:`closing`: the state is at the last mark (an epoch's last step)."""
        while True:
            try:
                return what()
            except RuntimeError as exc:
                reason = _lost_peer(exc)
            self._recover(reason)  # outside the except block, as in run_epoch

    def _epoch_over(self, state: TrainState) -> bool:
        """Whether the sampler already went through this epoch (a recovery after its last
        step): iterating it again would repeat the epoch's order."""
        sampler = self.source.sampler
        return sampler.epoch == state.epoch and sampler.consumed > 0 and sampler.remaining() == 0

    # -- marks ------------------------------------------------------------------------------

    def _marking(self, inner: Callable[[bool], None]) -> Callable[[bool], None]:
        def after_step(ends_epoch: bool) -> None:
            self.mark = self._take_mark()  # first: the step is done, whatever follows fails
            inner(ends_epoch)
            if not ends_epoch and self._joiners_agreed():
                raise _Grow

        return after_step

    def _joiners_agreed(self) -> bool:
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

    def _take_mark(self) -> _Mark:
        sums, sampler = self.state.sums, self.state.sampler
        lengths = (0, 0, 0, 0)
        if sums is not None:
            lengths = (len(sums.losses), len(sums.counts), len(sums.hits), sums.classed)
        cursor = dict(sampler.state_dict()) if sampler is not None else None
        return _Mark(self.state.step, cursor, lengths)

    # -- recovery ---------------------------------------------------------------------------

    def _recover(self, reason: str) -> None:
        state, mark = self.state, self.mark
        assert mark is not None and state.optimizer is not None, "set by run_epoch / fit"
        module = self._unwrap()
        state.optimizer.zero_grad(set_to_none=True)  # the partial step's gradients
        old_world = rd.get_world_size() if rd.has_group() else None
        self.membership.regroup()
        self.regroups += 1
        world = self._check_split("left")
        state.model = rewrap(module, self.cfg, self.device)
        steps: list[Any] = [None] * world
        dist.all_gather_object(steps, mark.step)
        if len(set(steps)) > 1:
            raise RegroupError(
                f"the survivors stopped at different optimizer steps ({steps}) after "
                f"{reason}; handing the furthest state to the others is not supported yet."
            )
        state.step = mark.step
        self._truncate_sums(mark)
        self._resplit(mark.cursor, world)
        self._say(f"a peer was lost ({reason})", old_world, mark.step)
        self.notify()

    def _grow(self) -> None:
        """Let the waiting joiners in at this step boundary (every member, agreed)."""
        old_world = rd.get_world_size()
        self._unwrap()
        self.membership.regroup(grow=True)
        self.regroups += 1
        self._take_state(old_world)

    def _take_state(self, old_world: int | None) -> None:
        """After a generation that let joiners in: a live member's state on every rank (the
        joiners load it), the module wrapped for the new group, the rest of the epoch re-split
        (a joiner's once it has its data: :meth:`run_epoch`). ``old_world``: None on a joiner."""
        state, m = self.state, self.membership
        src = next(r for r, slot in enumerate(m.members) if slot not in m.joined)
        saved = state.state_dict()  # a collective (the sums, the RNG states): on every rank
        saved["continue"] = {"global_batch": self.global_batch}
        got = broadcast_state(saved if m.rank == src else None, src)
        self.global_batch = int(got["continue"]["global_batch"])
        world = self._check_split("now")
        module = unwrap_model(state.model)
        if old_world is None:  # the joiner: the members' state, its own (empty) epoch sums
            state.load_state_dict(got, f"rank {src}'s state")
            state.sums, state.restored = EpochSums(), None
            self.join_cursor = got["sampler"]
        state.model = rewrap(module, self.cfg, self.device)
        if old_world is not None:
            self._resplit(got["sampler"], world)
        self._say(f"slot(s) {m.joined} rejoined", old_world, state.step)
        self.notify()

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

    def _say(self, what: str, old_world: int | None, step: int) -> None:
        if rd.is_master():
            world = self.membership.world_size
            print(
                f"rankwise: {what}; continuing on {world} rank(s) (was {old_world or '?'}) "
                f"from optimizer step {step}, global batch {self.global_batch} = "
                f"{shares_text(self.global_batch, world, self.cfg.grad_accum_steps)}",
                flush=True,
            )

    def _truncate_sums(self, mark: _Mark) -> None:
        sums = self.state.sums
        if sums is None:
            return
        losses, counts, hits, classed = mark.sums
        del sums.losses[losses:], sums.counts[counts:]
        del sums.hits[min(hits, len(sums.hits)) :]
        sums.classed = classed

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
