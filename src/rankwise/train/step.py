"""One optimizer step, top to bottom: :func:`train_step` over one accumulation window.

An epoch is cut into *windows*, the micro-batches of one optimizer step
(:func:`accumulation_windows`: ``grad_accum_steps`` of them, the last one maybe fewer), and
each window is one call::

    for each micro-batch of the window:
        with accumulate(model, last):              # DDP's no_sync on all but the last
            with precision.autocast(): loss = loss_fn(model(x), y)
            precision.backward(loss x weight / divisor)   # weight: uneven shares, else 1
        keep the detached loss for the epoch's sums; move the resume cursor
    clip, precision.step(optimizer), zero_grad, step += 1, a per-step scheduler

Nothing here synchronises the CPU with the device or the ranks: losses stay tensors in the
epoch's sums, summed once at the epoch's end (one all-reduce). Beyond a hand-written loop's
work a micro-batch makes four torch calls (the detached loss, ``argmax`` and ``==`` for the
accuracy, the batch's ``shape``) and one store ``set`` (the stall mark);
``tests/train/test_train_step_cost.py`` holds it to that.

The forward's pieces (:func:`split_batch`, :func:`model_loss`, :func:`is_class_target`) are
the evaluation's too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parallel import DataParallel

import rankwise.distributed as rd
from rankwise.parallel import accumulate
from rankwise.train.config import DistributedTrainingConfig
from rankwise.train.data import (
    Batch,
    TrainBatches,
    UserBatches,
    batch_length,
    has_batch_everywhere,
    to_device,
)
from rankwise.train.state import TrainState

LossFn = Callable[..., torch.Tensor] | None
BatchHook = Callable[[int, int, Any], None]  # (epoch, optimizer steps so far, sample ids)


@dataclass
class StepEnv:
    """What a step uses besides the state; fixed for one ``fit``."""

    config: DistributedTrainingConfig
    loss_fn: LossFn
    device: torch.device
    progress: rd.Progress  # marks each collective, so a timeout names the late rank
    hooks: Sequence[BatchHook] = ()  # after each micro-batch (``on_batch``)
    # After the forward, before the backward sends this micro-batch's gradient
    # (``before_backward``): a record written here exists for every micro-batch whose gradient
    # reached the others.
    early_hooks: Sequence[BatchHook] = ()


@dataclass
class MicroBatch:
    batch: Batch
    ids: Any  # the user's dataset indices of its samples, when recorded (else None)
    index: int  # its place in what is left of the epoch, from 0


class Window:
    """The micro-batches of one optimizer step, drawn from the epoch's stream as the step
    consumes them (never all held at once).

    ``divisor``: what the step's loss is averaged over, ``min(accum, micro-batches left)``
    when the epoch's length is known; ``accum`` for a loader without ``len`` (even for a
    short last window: docs/train.md says so). ``weight(n)``: the factor for a rank's mean loss
    over ``n`` samples when the ranks' shares of the global batch differ, else None.
    """

    def __init__(
        self,
        first: tuple[MicroBatch, bool],
        stream: Iterator[tuple[MicroBatch, bool]],
        size: int,
        divisor: int,
        weight: Callable[[int], float] | None,
    ) -> None:
        self._first, self._stream, self.size = first, stream, size
        self.divisor, self.weight = divisor, weight
        self.count = 0  # micro-batches drawn so far
        self.ends_epoch = False

    def __iter__(self) -> Iterator[tuple[MicroBatch, bool]]:
        """``(micro_batch, is_last_of_the_window)``."""
        item: tuple[MicroBatch, bool] | None = self._first
        while item is not None:
            micro, ends_epoch = item
            self.count += 1
            last = ends_epoch or self.count == self.size
            self.ends_epoch = ends_epoch
            yield micro, last
            item = None if last else next(self._stream, None)


def micro_batch_count(source: Any) -> int | None:
    """This rank's micro-batches left in the epoch (None: a loader without ``len``)."""
    return len(source) if not isinstance(source, UserBatches) or source.sized else None


def accumulation_windows(source: Any, accum: int) -> Iterator[Window]:
    """The rest of the epoch's micro-batches as windows of ``accum`` (one optimizer step each).

    >>> from rankwise.train.data import UserBatches
    >>> source = UserBatches([torch.ones(2, 1)] * 5)
    >>> [(w.divisor, sum(1 for _ in w)) for w in accumulation_windows(source, 2)]
    [(2, 2), (2, 2), (1, 1)]
    """
    total = micro_batch_count(source)
    stream = _micro_batches(source, total)
    weight = source.loss_weight if isinstance(source, TrainBatches) and source.uneven else None
    start = 0
    head = next(stream, None)
    while head is not None:
        divisor = accum if total is None else min(accum, total - start)
        window = Window(head, stream, accum, divisor, weight)
        yield window  # the step consumes it before the next one is drawn
        start += window.count
        head = None if window.ends_epoch else next(stream, None)


def _micro_batches(source: Any, total: int | None) -> Iterator[tuple[MicroBatch, bool]]:
    """``(micro_batch, ends_epoch)``. For loaders without len, ranks agree on every step
    whether each still has a batch, looking one batch ahead so the last one is known."""
    if total is not None:
        for i, (batch, ids) in enumerate(source):
            yield MicroBatch(batch, ids, i), i + 1 == total
        return
    it = iter(source)
    step = 0
    current = next(it, None)
    if not has_batch_everywhere(current is not None, step):
        return
    while current is not None:
        ahead = next(it, None)
        more = has_batch_everywhere(ahead is not None, step + 1)
        yield MicroBatch(current[0], current[1], step), not more
        current = ahead if more else None
        step += 1


def train_step(state: TrainState, env: StepEnv, window: Window, source: Any) -> None:
    """One optimizer step over ``window``'s micro-batches of ``source`` (whose cursor moves
    past each one); the losses and hits go to ``state.sums``."""
    cfg, model, precision, sums = env.config, state.model, state.precision, state.sums
    assert precision is not None and sums is not None and state.optimizer is not None, "fit()"
    epoch, step = state.epoch, state.step + 1
    needs_target, sync = env.loss_fn is not None, _sync_name(cfg.strategy)
    for micro, last in window:
        batch = micro.batch if env.device.type == "cpu" else to_device(micro.batch, env.device)
        x, y = split_batch(batch, needs_target)
        n = batch_length(x)
        # One store set (no reply awaited): a peer whose collective times out reads it.
        if last:
            env.progress.mark(f"{sync} at step {step} (epoch {epoch})")
        else:
            env.progress.mark(f"micro-batch {micro.index} (no sync) of step {step} (epoch {epoch})")
        with accumulate(model, is_last=last):
            with precision.autocast():
                out = model(x)
                loss = model_loss(out, y, env.loss_fn, model)
            for hook in env.early_hooks:
                hook(epoch, state.step, micro.ids)
            scaled = loss if window.weight is None else loss * window.weight(n)
            precision.backward(scaled / window.divisor if window.divisor > 1 else scaled)
        sums.losses.append(loss.detach())
        sums.counts.append(n)
        if sums.classes is None:  # decided on the epoch's first batch: the data set is fixed
            sums.classes = is_class_target(out, y)
        if sums.classes:
            sums.add_hits(out.argmax(1) == y)  # argmax has no gradient: nothing to detach
            sums.classed += n
        source.advance(n)  # the resume cursor (uneven shares: past the whole global batch)
        for hook in env.hooks:
            hook(epoch, state.step, micro.ids)
    optimizer_step(state, cfg)


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


def _sync_name(strategy: str) -> str:
    if strategy == "fsdp":
        return "the forward/backward of FSDP (all_gather, reduce_scatter)"
    return "the all_reduce of the gradients" if strategy == "ddp" else "the forward/backward"


# -- the forward's pieces (the evaluation's too) -----------------------------------------------


def split_batch(batch: Batch, needs_target: bool) -> tuple[Any, Any]:
    """``(inputs, targets)`` of a batch; targets may be None when the model computes its own
    loss (``loss_fn=None``)."""
    if isinstance(batch, list | tuple):
        if len(batch) == 2:
            return batch[0], batch[1]
        if len(batch) == 1 and not needs_target:
            return batch[0], None
    elif not needs_target:
        return batch, None
    raise ValueError(
        f"a batch must be an (input, target) pair, got a {type(batch).__name__}"
        + (f" of {len(batch)} items" if isinstance(batch, list | tuple) else "")
        + "; make the Dataset return (x, y), or pass loss_fn=None to a model that returns "
        "{'loss': ...}."
    )


def model_loss(outputs: Any, targets: Any, loss_fn: LossFn, model: Any = None) -> torch.Tensor:
    """The batch-mean loss: ``loss_fn(outputs, targets)``, or the model's own ``"loss"``.

    A DataParallel gathers each GPU replica's scalar ``"loss"`` into a vector of one entry per
    GPU; its mean is the batch's loss (replicas get equal shares, the last one maybe fewer).
    """
    if loss_fn is not None:
        return loss_fn(outputs, targets)
    if isinstance(outputs, dict) and "loss" in outputs:
        loss = outputs["loss"]
        if isinstance(model, DataParallel) and isinstance(loss, torch.Tensor) and loss.dim() == 1:
            return loss.mean()
        return loss
    raise ValueError(
        f"loss_fn is None, so the model must return a dict with a 'loss' entry; it returned "
        f"a {type(outputs).__name__}. Pass a loss_fn, e.g. torch.nn.CrossEntropyLoss()."
    )


def is_class_target(outputs: Any, targets: Any) -> bool:
    """Accuracy applies when targets are class indices and outputs are [B, C] logits."""
    return (
        isinstance(targets, torch.Tensor)
        and isinstance(outputs, torch.Tensor)
        and targets.ndim == 1
        and not targets.is_floating_point()
        and outputs.ndim == 2
        and outputs.shape[0] == targets.shape[0]
    )
