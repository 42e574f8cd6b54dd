"""The epoch's running metric sums: what a rank keeps per micro-batch, reduced once.

Per micro-batch only what the step already has is kept (the detached loss, the batch length,
the ``prediction == target`` mask); the reductions wait for the epoch's end (or every
``FOLD_EVERY`` masks), where one ``stack`` / ``cat`` replaces per-step tensor ops. Nothing
here reads a tensor on the host per step.

>>> sums = EpochSums()
>>> sums.losses.append(torch.tensor(0.5)); sums.counts.append(4)
>>> summarize(sums.local())
(0.5, None)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import rankwise.distributed as rd

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
