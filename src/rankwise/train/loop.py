"""The epoch loop: one :func:`~rankwise.train.step.train_step` per accumulation window, and
after each step, in this order, everything else a step may trigger::

    for window in accumulation_windows(source, grad_accum_steps):
        train_step(state, env, window, source)      # the whole optimizer step: step.py
        continuing.mark()                           # continue mode: a lost peer rolls back here
        logger.step(...)                            # rank 0: bar, CSV / TensorBoard rows
        check_sync(...)                             # every check_sync_every_n_steps
        checkpointer.after_step(state, ends_epoch)  # every checkpoint_every_n_steps
        continuing.joiners_agreed()                 # continue mode: let restarted ranks in

Continue mode (``rankwise launch --on-failure continue``) is the visible branch of
:func:`run_epoch`: a step that fails because a peer is gone is dropped, the survivors regroup
and the epoch goes on from the last mark (:mod:`rankwise.train.continuing`). Without it the
epoch is :func:`train_epoch` alone.

Nothing here synchronises the CPU with the device or the ranks per step: at log intervals rank
0 starts a non-blocking copy of its recent losses to the host and shows those that have landed
(:class:`~rankwise.train.sums.LossReadout`), so even the progress line never waits for the GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import rankwise.distributed as rd
from rankwise.train.checkpoint import Checkpointer
from rankwise.train.checks import check_sync
from rankwise.train.closings import END, FIGURES
from rankwise.train.continuing import Continuing, JoinersWaiting
from rankwise.train.data import UserBatches, check_even
from rankwise.train.state import TrainState
from rankwise.train.step import StepEnv, accumulation_windows, micro_batch_count, train_step
from rankwise.train.sums import EpochResult, LossReadout
from rankwise.train.tracking.logger import TrainingLogger

T = TypeVar("T")


@dataclass
class FitRun:
    """What one ``fit`` runs its epochs with besides the state."""

    step: StepEnv
    logger: TrainingLogger
    checkpointer: Checkpointer
    continuing: Continuing | None = None  # under ``--on-failure continue`` only
    # The world changed (continue mode): the logger follows rank 0, the callbacks hear of it.
    on_regroup: Callable[[], None] = lambda: None


def run_epoch(state: TrainState, run: FitRun, source: Any) -> EpochResult:
    """The rest of epoch ``state.epoch``; under continue mode, through lost peers and joiners."""
    continuing = run.continuing
    if continuing is None:
        return train_epoch(state, run, source)
    source = continuing.begin_epoch(source)
    regroup: str | None = None  # what the last pass left to do: "" grow, else recover (why)
    while True:
        try:
            # Inside the try: a grow whose joiner is lost on the way in, or a second peer lost
            # during a recovery, is recovered from in turn (a bounded number of times in a row:
            # Continuing.recover).
            if regroup:
                continuing.recover(regroup)
            elif regroup is not None:
                continuing.grow()
            if regroup is not None:
                regroup = None
                run.on_regroup()  # the logger follows rank 0 (maybe another process now)
            if continuing.epoch_over():  # lost in the epoch's closing all-reduce
                return _figures(state, run)
            return train_epoch(state, run, continuing.source)
        except JoinersWaiting:
            regroup = ""
        except RuntimeError as exc:
            # A rank's own error is raised here. The regroup itself runs outside this except
            # block: the traceback's frames hold the DDP wrapper, and so the broken group,
            # whose sockets must close for blocked peers to wake up.
            regroup = continuing.lost_peer(exc)


def between_epochs(run: FitRun, what: Callable[[], T], epoch: int, stage: int) -> T:
    """``what()`` between epochs or after the last (a checkpoint save, the wait for the last
    one), and its answer; under continue mode it is closing section ``(epoch, stage)``
    (:mod:`rankwise.train.closings`: ``SAVE`` after epoch ``epoch``, ``END`` after the last)
    and a peer lost in it is recovered from: ``what`` runs again in the new group (the state
    is at the last mark: an epoch's last step, the checkpointer's choices as they were) unless
    every survivor had done it."""
    continuing = run.continuing
    reason: str | None = None
    while True:
        try:
            if reason is not None and continuing is not None:
                continuing.recover(reason)  # outside the except block, as in run_epoch
                reason = None
                run.on_regroup()
            if continuing is None:
                return what()
            # nothing follows the end of fit's section on another rank: no barrier after it
            return continuing.closings.run(
                epoch, stage, what, run.checkpointer, commit=stage != END
            )
        except RuntimeError as exc:
            if continuing is None:
                raise
            reason = continuing.lost_peer(exc)


def train_epoch(state: TrainState, run: FitRun, source: Any) -> EpochResult:
    """Run the rest of epoch ``state.epoch`` into ``state.sums``; return the whole epoch's
    figures over the world."""
    env, logger, continuing = run.step, run.logger, run.continuing
    cfg, progress, sums = env.config, env.progress, state.sums
    assert sums is not None, "set by fit()"
    source.set_epoch(state.epoch)
    total = micro_batch_count(source)
    if isinstance(source, UserBatches) and total is not None:
        check_even(total)
    logger.start_epoch(state.epoch, total or 0)
    state.model.train()
    # Rank 0 starts a copy of its recent losses to the host every `every` micro-batches and
    # shows the ones that have landed; the other ranks never do.
    every = (
        (cfg.log_every_n_batches or 10)
        if rd.is_master() and (cfg.verbose or cfg.logger_names())
        else 0
    )
    readout, started = LossReadout(env.device), time.perf_counter()
    logged = first = len(sums.losses)  # the sums may hold the epoch's earlier micro-batches
    done = 0  # micro-batches of this pass (the bar's count, `total` of them)
    for window in accumulation_windows(source, cfg.grad_accum_steps):
        train_step(state, env, window, source)
        done += window.count
        if continuing is not None:
            continuing.mark()  # first: the step is done, whatever follows may fail
        if every and (done // every > (done - window.count) // every or window.ends_epoch):
            readout.issue(sums.losses[logged:], sums.counts[logged:])
            logged = len(sums.losses)
            samples = sum(sums.counts[first:]) * rd.get_world_size()
            logger.step(done, state.step, readout.mean(), samples / _since(started))
        check_sync(state.model, cfg, state.step, progress)  # every N steps, if set
        run.checkpointer.after_step(state, window.ends_epoch)
        if continuing is not None and not window.ends_epoch and continuing.joiners_agreed():
            raise JoinersWaiting
    return _figures(state, run)


def _figures(state: TrainState, run: FitRun) -> EpochResult:
    """The epoch's figures over the world (a collective; under continue mode closing section
    ``(epoch, FIGURES)``, which a rank past it after a regroup does not do again)."""
    sums = state.sums
    assert sums is not None, "set by fit()"
    run.step.progress.mark(f"the all_reduce of the epoch's metrics (epoch {state.epoch})")
    if run.continuing is None:
        return sums.result()
    return run.continuing.closings.run(state.epoch, FIGURES, sums.result)


def _since(started: float) -> float:
    return max(time.perf_counter() - started, 1e-9)
