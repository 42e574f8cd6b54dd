"""The epoch's running metric sums: what a rank keeps per micro-batch, reduced once.

Per micro-batch only what the step already has is kept (the detached loss, the batch length,
the ``prediction == target`` mask); the reductions wait for the epoch's end (or every
``FOLD_EVERY`` masks), where one ``stack`` / ``cat`` replaces per-step tensor ops. Nothing
here reads a tensor on the host per step; rank 0's progress line reads its running loss
through :class:`LossReadout`, which never waits for the device.

>>> sums = EpochSums()
>>> sums.losses.append(torch.tensor(0.5)); sums.counts.append(4)
>>> summarize(sums.local())
(0.5, None)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

import rankwise.distributed as rd

FOLD_EVERY = 256  # accuracy masks summed in one op; bounds their memory (256 x batch bytes)


class EpochResult(NamedTuple):
    """An epoch's figures over the whole world."""

    loss: float  # the mean over every sample trained
    accuracy: float | None  # None unless every target was a class index
    samples: int  # trained by all ranks together


class SumsLength(NamedTuple):
    """How far the sums had got at an optimizer step (continue mode rolls back to it)."""

    losses: int
    counts: int
    hits: int
    classed: int


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
    classes: bool | None = None  # whether accuracy applies: decided on the epoch's first batch
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

    def result(self) -> EpochResult:
        """The epoch's figures over the world (a collective)."""
        totals = self.reduced()
        loss, accuracy = summarize(totals)
        return EpochResult(loss, accuracy, int(totals[1]))

    def length(self) -> SumsLength:
        return SumsLength(len(self.losses), len(self.counts), len(self.hits), self.classed)

    def truncate(self, to: SumsLength) -> None:
        """Forget the micro-batches after ``to`` (a step lost with a peer is trained again)."""
        del self.losses[to.losses :], self.counts[to.counts :]
        del self.hits[min(to.hits, len(self.hits)) :]
        self.classed = to.classed


class LossReadout:
    """Rank 0's running mean loss for the progress line, read without waiting for the device.

    At a log point :meth:`issue` stacks the micro-batch losses since the previous one and
    starts their copy to the host (``non_blocking``: into page-locked memory on CUDA, with an
    event recorded behind it); :meth:`mean` folds in every copy that has landed (``query()``,
    never a wait) and returns the running mean over them, or None while none has. So on a GPU
    the line usually shows the losses up to the previous log point, and the step never blocks
    on the device for it; on the CPU the copy is done at once and the line is current. Either
    way the values are read from a host tensor through numpy, never with ``.item()``.

    >>> readout = LossReadout(torch.device("cpu"))
    >>> readout.issue([torch.tensor(1.0), torch.tensor(4.0)], [2, 1])
    >>> readout.mean()
    2.0
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.pending: deque[tuple[torch.Tensor, list[int], Any]] = deque()
        self.total, self.count = 0.0, 0

    def issue(self, losses: list[torch.Tensor], counts: list[int]) -> None:
        """Start copying ``losses`` (batch means over ``counts`` samples) to the host."""
        if not losses:
            return
        host = torch.stack(losses).to("cpu", torch.float64, non_blocking=True)
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
        self.pending.append((host, counts, event))

    def mean(self) -> float | None:
        """The mean loss over every copy that has reached the host (None: none yet)."""
        while self.pending and (self.pending[0][2] is None or self.pending[0][2].query()):
            host, counts, _ = self.pending.popleft()
            self.total += float(np.dot(host.numpy(), counts))
            self.count += sum(counts)
        return self.total / self.count if self.count else None


def summarize(totals: torch.Tensor) -> tuple[float, float | None]:
    loss_sum, count, correct, classed = (float(v) for v in totals)
    if count == 0:
        return float("nan"), None
    return loss_sum / count, (correct / count if classed == count else None)
