"""One training epoch over a :class:`~rankwise.train.state.TrainState`: micro-batches,
accumulation windows, optimizer steps, metric sums.

The step reads top to bottom (torchtitan's style)::

    for each micro-batch i of this rank:
        last = is_sync_step(i, A, total)           # ends an accumulation window?
        with accumulate(model, last):              # no_sync on all but the last
            with precision.autocast(): loss = loss_fn(model(x), y)
            precision.backward(loss / window)      # uneven shares: loss x weight first
        sampler.advance(len(x))                    # the resume cursor
        if last: optimizer_step(state, cfg)       # clip, step, zero_grad, scheduler
                 env.after_step(ends_epoch)       # the trainer's sync check and checkpoints

Nothing here synchronises the CPU with the device or the ranks per step: losses stay tensors
in a list and are summed once at the end of the epoch (one all-reduce); at log intervals rank 0
starts a non-blocking copy of its recent losses to the host and prints those that have landed
(:class:`~rankwise.train.sums.LossReadout`), so even the progress line never waits for the GPU. Beyond a hand-written loop's work a micro-batch makes four
torch calls (the detached loss, ``argmax`` and ``==`` for the accuracy, the batch's ``shape``)
and one store ``set`` (the stall mark); ``tests/test_train_step_cost.py`` holds it to that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import rankwise.distributed as rd
from rankwise.parallel import accumulate, is_sync_step
from rankwise.train.config import DistributedTrainingConfig
from rankwise.train.data import (
    UserBatches,
    batch_length,
    check_even,
    has_batch_everywhere,
    to_device,
)
from rankwise.train.evaluation import is_class_target, model_loss, split_batch
from rankwise.train.loggers import TrainingLogger
from rankwise.train.pipeline import TrainBatches
from rankwise.train.state import TrainState
from rankwise.train.sums import LossReadout

BatchHook = Callable[[int, int, Any], None]  # (epoch, optimizer steps so far, sample ids)


@dataclass
class StepEnv:
    """What the loop uses besides the state; fixed for one ``fit``."""

    config: DistributedTrainingConfig
    loss_fn: Callable[..., torch.Tensor] | None
    device: torch.device
    progress: rd.Progress  # marks each collective, so a timeout names the late rank
    logger: TrainingLogger
    hooks: Sequence[BatchHook]  # called after each micro-batch
    after_step: Callable[[bool], None]  # after each optimizer step: (ends the epoch?)
    # Called after the forward, before the backward sends this micro-batch's gradient: a record
    # written here exists for every micro-batch whose gradient reached the others.
    early_hooks: Sequence[BatchHook] = ()


def _micro_batches(source: Any) -> Iterator[tuple[Any, Any, bool | None]]:
    """``(batch, ids, is_last)``; ``is_last`` is None when the count is known up front (the
    caller uses ``is_sync_step``). For loaders without len, ranks agree on every step whether
    each still has a batch, looking one batch ahead so the last one is known."""
    if not isinstance(source, UserBatches) or source.sized:
        for batch, ids in source:
            yield batch, ids, None
        return
    it = iter(source)
    step = 0
    current = next(it, None)
    if not has_batch_everywhere(current is not None, step):
        return
    while current is not None:
        ahead = next(it, None)
        more = has_batch_everywhere(ahead is not None, step + 1)
        yield current[0], current[1], not more
        current = ahead if more else None
        step += 1


def _sync_name(strategy: str) -> str:
    if strategy == "fsdp":
        return "the forward/backward of FSDP (all_gather, reduce_scatter)"
    return "the all_reduce of the gradients" if strategy == "ddp" else "the forward/backward"


def train_epoch(state: TrainState, env: StepEnv, source: Any) -> tuple[float, float | None, int]:
    """Run the rest of epoch ``state.epoch`` into ``state.sums``; return ``(loss, accuracy,
    global samples)`` of the whole epoch."""
    cfg, model = env.config, state.model
    precision, sums, epoch = state.precision, state.sums, state.epoch
    assert precision is not None and sums is not None, "set up by fit()"
    source.set_epoch(epoch)
    total = len(source) if not isinstance(source, UserBatches) or source.sized else None
    if isinstance(source, UserBatches) and total is not None:
        check_even(total)
    accum = cfg.grad_accum_steps
    hooks = env.hooks
    # Rank 0 starts a copy of its recent losses to the host every `tick` micro-batches and shows
    # the ones that have landed, for the bar and the log lines; the other ranks never do.
    tick = (cfg.log_every_n_batches or 10) if rd.is_master() and (cfg.verbose or cfg.log_dir) else 0
    env.logger.start_epoch(epoch, total or 0)
    model.train()
    loss_fn = env.loss_fn
    needs_target = loss_fn is not None
    device = env.device
    on_cpu = device.type == "cpu"
    classes: bool | None = None  # decided on the first batch: the data set does not change
    started, logged, logged_n = time.perf_counter(), 0, 0
    readout = LossReadout(device)  # the progress line's loss, never a wait for the device
    window_start = 0
    progress, sync = env.progress, _sync_name(cfg.strategy)
    # Uneven shares of the global batch (--on-failure continue, a world that does not divide
    # it): each rank's mean loss is weighted by its share, so DDP's average is the global mean.
    weigh = source.loss_weight if isinstance(source, TrainBatches) and source.uneven else None
    for i, (batch, ids, final) in enumerate(_micro_batches(source)):
        # accum 1 (the common case): every micro-batch is a step, no window arithmetic.
        last = accum == 1 or (
            is_sync_step(i, accum, total) if final is None else (final or (i + 1) % accum == 0)
        )
        if i == window_start:  # a new window: how many micro-batches it averages over
            # (unsized loaders: accum, even for a short last window; docs/train.md says so)
            window = accum if total is None else min(accum, total - i)
        x, y = split_batch(batch if on_cpu else to_device(batch, device), needs_target)
        n = batch_length(x)
        # One store set (no reply awaited): a peer whose collective times out reads it.
        step = state.step + 1
        if last:
            progress.mark(f"{sync} at step {step} (epoch {epoch})")
        else:
            progress.mark(f"micro-batch {i} (no sync) of step {step} (epoch {epoch})")
        with accumulate(model, is_last=last):
            with precision.autocast():
                out = model(x)
                loss = model_loss(out, y, loss_fn, model)
            for hook in env.early_hooks:
                hook(epoch, state.step, ids)
            scaled = loss if weigh is None else loss * weigh(n)
            precision.backward(scaled / window if window > 1 else scaled)
        sums.losses.append(loss.detach())
        sums.counts.append(n)
        if classes is None:
            classes = is_class_target(out, y)
        if classes:
            sums.add_hits(out.argmax(1) == y)  # argmax has no gradient: nothing to detach
            sums.classed += n
        source.advance(n)
        for hook in hooks:
            hook(epoch, state.step, ids)
        if last:
            optimizer_step(state, cfg)
            window_start = i + 1
        if tick and ((i + 1) % tick == 0 or i + 1 == total):
            readout.issue(sums.losses[logged:], sums.counts[logged:])
            logged_n += sum(sums.counts[logged:])
            logged = len(sums.losses)
            rate = logged_n * rd.get_world_size() / max(time.perf_counter() - started, 1e-9)
            env.logger.step(i + 1, state.step, readout.mean(), rate)
        if last:  # after the step's log row: under --on-failure continue this may regroup
            env.after_step(bool(final) if final is not None else i + 1 == total)
    progress.mark(f"the all_reduce of the epoch's metrics (epoch {epoch})")
    return sums.result()


def optimizer_step(state: TrainState, cfg: DistributedTrainingConfig) -> None:
    """Clip (``cfg.grad_clip_norm``), step through the precision plug-in (the GradScaler's
    unscale and skip), zero the gradients, count the step, step a per-step scheduler."""
    optimizer, precision = state.optimizer, state.precision
    assert optimizer is not None and precision is not None, "set up by fit()"
    if cfg.grad_clip_norm is not None:
        precision.clip_grad_norm_(state.model, cfg.grad_clip_norm, optimizer)
    precision.step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    state.step += 1
    if state.scheduler is not None and cfg.scheduler_interval == "step":
        state.scheduler.step()


def epoch_scheduler_step(scheduler: Any, metric: float) -> None:
    """Step a per-epoch scheduler at the epoch's end; ``ReduceLROnPlateau`` watches ``metric``
    (the validation loss when there is one, else the training loss)."""
    if scheduler is None:
        return
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(metric)
    else:
        scheduler.step()
