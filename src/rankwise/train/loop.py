"""One training epoch: micro-batches, accumulation windows, optimizer steps, metric sums.

The step reads top to bottom (torchtitan's style)::

    for each micro-batch i of this rank:
        last = is_sync_step(i, A, total)           # ends an accumulation window?
        with accumulate(model, last):              # no_sync on all but the last
            with precision.autocast(): loss = loss_fn(model(x), y)
            precision.backward(loss / window)
        sampler.advance(len(x))                    # the resume cursor
        if last: clip, precision.step(optimizer), zero_grad, scheduler, maybe checkpoint

Nothing here synchronises the CPU with the device or the ranks per step: losses stay tensors
in a list and are summed once at the end of the epoch (one all-reduce); rank 0 reads its own
running loss only at log intervals. Beyond a hand-written loop's work a micro-batch makes four
torch calls (the detached loss, ``argmax`` and ``==`` for the accuracy, the batch's ``shape``)
and one store ``set`` (the stall mark); ``tests/test_train_step_cost.py`` holds it to that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

import rankwise.distributed as rd
from rankwise.parallel import accumulate, is_sync_step
from rankwise.train.data import UserBatches, batch_length, check_even, has_batch_everywhere
from rankwise.train.evaluation import is_class_target, model_loss, split_batch

if TYPE_CHECKING:
    from rankwise.train.trainer import DistributedTrainer

BatchHook = Callable[[Any, int, int, Any], None]
FOLD_EVERY = 256  # accuracy masks summed in one op; bounds their memory (256 x batch bytes)


@dataclass
class EpochSums:
    """This rank's running sums for the epoch; ``carried`` holds the whole world's sums of
    the part of the epoch done before a resume (rank 0 only, so the all-reduce adds it once).

    Per micro-batch only what the step already has is kept (the detached loss, the batch
    length, the ``prediction == target`` mask): the reductions wait for the epoch's end (or
    every ``FOLD_EVERY`` masks), where one ``stack`` / ``cat`` replaces per-step tensor ops.
    """

    losses: list[torch.Tensor] = field(default_factory=list)  # batch-mean losses
    counts: list[int] = field(default_factory=list)
    hits: list[torch.Tensor] = field(default_factory=list)  # bool: prediction == target
    folded: torch.Tensor | None = None  # correct predictions of the masks folded so far
    classed: int = 0
    carried: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])

    def local(self) -> torch.Tensor:
        """[loss sum, samples, correct, samples with class targets] as float64."""
        out = torch.tensor(self.carried, dtype=torch.float64)
        if self.losses:
            out[0] += self._loss_sum(0)
            out[1] += sum(self.counts)
        self.fold()
        if self.folded is not None:
            out[2] += self.folded.cpu()
        out[3] += self.classed
        return out

    def add_hits(self, hits: torch.Tensor) -> None:
        """Keep a micro-batch's ``prediction == target`` mask; every ``FOLD_EVERY`` masks are
        summed into one count, so a long epoch holds at most that many masks."""
        self.hits.append(hits)
        if len(self.hits) == FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        if self.hits:
            count = torch.cat(self.hits).sum()
            self.folded = count if self.folded is None else self.folded + count
            self.hits.clear()

    def _loss_sum(self, start: int) -> torch.Tensor:
        # float64 before the products: the sum of N losses x counts stays exact enough.
        losses = torch.stack(self.losses[start:]).double().cpu()
        return (losses * torch.tensor(self.counts[start:], dtype=torch.float64)).sum()

    def reduced(self) -> torch.Tensor:
        """The world's sums (on the CPU): one all-reduce on the collective device."""
        return rd.all_reduce(self.local().to(rd.collective_device())).cpu()

    def running_loss(self, start: int) -> tuple[float, int]:
        """Sum and count of this rank's losses since ``start`` (rank 0's progress display)."""
        if start >= len(self.losses):
            return 0.0, 0
        return float(self._loss_sum(start)), sum(self.counts[start:])


def summarize(totals: torch.Tensor) -> tuple[float, float | None]:
    loss_sum, count, correct, classed = (float(v) for v in totals)
    if count == 0:
        return float("nan"), None
    return loss_sum / count, (correct / count if classed == count else None)


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


def train_epoch(
    trainer: DistributedTrainer, source: Any, epoch: int, sums: EpochSums
) -> tuple[float, float | None, int]:
    """Run the rest of epoch ``epoch``; return ``(loss, accuracy, global samples)``."""
    cfg, model, precision = trainer.config, trainer.model, trainer.precision
    assert cfg is not None, "set by fit()"
    source.set_epoch(epoch)
    total = len(source) if not isinstance(source, UserBatches) or source.sized else None
    if isinstance(source, UserBatches) and total is not None:
        check_even(total)
    accum = cfg.grad_accum_steps
    hooks = trainer.batch_hooks()
    # Rank 0 reads its running loss (one .item()) every `tick` micro-batches, for the bar and
    # the log lines; the other ranks never do.
    tick = (
        (cfg.log_every_n_batches or 10)
        if trainer.is_master() and (cfg.verbose or cfg.log_dir)
        else 0
    )
    trainer.logger.start_epoch(epoch, total or 0)
    model.train()
    loss_fn = trainer.loss_fn
    needs_target = loss_fn is not None
    on_cpu = trainer.device.type == "cpu"
    classes: bool | None = None  # decided on the first batch: the data set does not change
    started, logged, logged_sum, logged_n = time.perf_counter(), 0, 0.0, 0
    window_start = 0
    progress, sync = trainer.progress, _sync_name(cfg.strategy)
    for i, (batch, ids, final) in enumerate(_micro_batches(source)):
        # accum 1 (the common case): every micro-batch is a step, no window arithmetic.
        last = accum == 1 or (
            is_sync_step(i, accum, total) if final is None else (final or (i + 1) % accum == 0)
        )
        if i == window_start:  # a new window: how many micro-batches it averages over
            # (unsized loaders: accum, even for a short last window; docs/train.md says so)
            window = accum if total is None else min(accum, total - i)
        x, y = split_batch(batch if on_cpu else trainer.to_device(batch), needs_target)
        n = batch_length(x)
        # One store set (no reply awaited): a peer whose collective times out reads it.
        step = trainer.global_step + 1
        if last:
            progress.mark(f"{sync} at step {step} (epoch {epoch})")
        else:
            progress.mark(f"micro-batch {i} (no sync) of step {step} (epoch {epoch})")
        with accumulate(model, is_last=last):
            with precision.autocast():
                out = model(x)
                loss = model_loss(out, y, loss_fn, model)
            precision.backward(loss / window if window > 1 else loss)
        sums.losses.append(loss.detach())
        sums.counts.append(n)
        if classes is None:
            classes = is_class_target(out, y)
        if classes:
            sums.add_hits(out.argmax(1) == y)  # argmax has no gradient: nothing to detach
            sums.classed += n
        source.advance(n)
        for hook in hooks:
            hook(trainer, epoch, trainer.global_step, ids)
        if last:
            trainer.optimizer_step()
            window_start = i + 1
            ends_epoch = bool(final) if final is not None else i + 1 == total
            trainer.after_optimizer_step(epoch, sums, ends_epoch)
        if tick and ((i + 1) % tick == 0 or i + 1 == total):
            s, c = sums.running_loss(logged)
            logged, logged_sum, logged_n = len(sums.losses), logged_sum + s, logged_n + c
            rate = logged_n * rd.get_world_size() / max(time.perf_counter() - started, 1e-9)
            trainer.logger.step(i + 1, trainer.global_step, logged_sum / max(logged_n, 1), rate)
    progress.mark(f"the all_reduce of the epoch's metrics (epoch {epoch})")
    totals = sums.reduced()
    mean_loss, accuracy = summarize(totals)
    return mean_loss, accuracy, int(totals[1])
