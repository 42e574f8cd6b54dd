"""Uneven shares of a global batch: :class:`GlobalBatchShares`.

When the world does not divide the global batch ``B`` (``rankwise launch --on-failure
continue`` after a lost rank: 15 samples for 2 ranks), the ranks take the epoch one global
batch at a time. With the sampler's cursor at ``c`` the next global batch is positions
``[c, c + B)`` of the epoch's global order, and rank ``r`` of ``R`` takes positions
``c + r, c + r + R, ...`` below ``c + B``: ``B // R + (r < B % R)`` samples, so the shares
differ by at most one, and the k-th global batch holds the same samples whatever ``R`` is (as
with even shares, where this is exactly the sampler's own strided split). The cursor moves
by the positions the whole global batch covered::

    B = 15, R = 2, cursor 60: rank 0 takes positions 60 62 .. 74 (8), rank 1 61 63 .. 73 (7)

The epoch's end: the last global batch holds what is left, ``(N - c) % B`` positions, split the
same way; nothing is padded, so every sample is taken exactly once. Only when that tail is
shorter than the world (some rank would get nothing: possible only if the world the run
started on did not divide ``N`` either, when its own split padded too) is it padded up to
``R`` positions that wrap to the start of the order (torch's padding rule), one per rank.

Each rank multiplies its mean loss by :meth:`GlobalBatchShares.weight`, ``n_r * R / B_k``
(``n_r`` its share, ``B_k`` the global batch's size): DDP's average over the ``R`` ranks is
then the mean over the global batch, the gradient an even split would give.

>>> from rankwise.data import DistributedSampler
>>> ranks = [DistributedSampler(31, num_replicas=2, rank=r, shuffle=False) for r in (0, 1)]
>>> for s in ranks:   # the tail (30) is 1 sample for 2 ranks: padded with position 31 -> 0
...     print([a.tolist() for a in GlobalBatchShares(s, 15).arrays()])
[[0, 2, 4, 6, 8, 10, 12, 14], [15, 17, 19, 21, 23, 25, 27, 29], [30]]
[[1, 3, 5, 7, 9, 11, 13], [16, 18, 20, 22, 24, 26, 28], [0]]
>>> shares = GlobalBatchShares(ranks[1], 15)
>>> shares.weight(7), len(shares)
(0.9333333333333333, 3)
>>> shares.advance(); ranks[1].consumed
15
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler

from rankwise.data.partition import global_batch_end, strided_positions
from rankwise.data.sampler import DistributedSampler
from rankwise.validation import check_int

__all__ = ["GlobalBatchShares"]


class GlobalBatchShares(Sampler[list[int]]):
    """This rank's share of each global batch of ``batch`` positions of ``sampler``'s order,
    from its cursor to the end of the epoch (see the module doc).

    A batch sampler: iterating yields one list of dataset indices per global batch (a
    ``DataLoader``'s ``batch_sampler``; with ``record`` each list is also kept in ``issued``
    until the caller takes it), :meth:`arrays` the same as int64 arrays. Iterating never
    moves the cursor: :meth:`advance` does, once this rank has trained its share. ``len()``
    counts the global batches from the cursor, so read it before iterating.
    """

    def __init__(self, sampler: DistributedSampler, batch: int, record: bool = False) -> None:
        self.sampler = sampler
        self.batch = check_int("batch", batch, minimum=1)
        self.issued: collections.deque[list[int]] | None = collections.deque() if record else None

    def _end(self, start: int) -> int:
        s = self.sampler
        return global_batch_end(start, len(s.dataset), s.num_replicas, self.batch)  # type: ignore[arg-type]

    def __len__(self) -> int:
        start = self.sampler.consumed
        return max(-(-(self._end(start) - start) // self.batch), 0)

    def __iter__(self) -> Iterator[list[int]]:
        for chunk in self.arrays():
            indices = chunk.tolist()
            if self.issued is not None:
                self.issued.append(indices)
            yield indices

    def arrays(self) -> Iterator[np.ndarray]:
        """This rank's dataset indices of each global batch from the cursor, as int64 arrays."""
        s = self.sampler
        start = s.consumed
        end = self._end(start)
        for lo in range(start, end, self.batch):
            mine = strided_positions(min(lo + self.batch, end), s.num_replicas, s.rank, start=lo)
            yield s.order_at(np.arange(mine.start, mine.stop, mine.step, dtype=np.int64))

    def current(self) -> int:
        """How many positions (all ranks together) the global batch at the cursor covers."""
        cursor = self.sampler.consumed
        return min(self.batch, self._end(cursor) - cursor)

    def weight(self, n: int) -> float:
        """The factor for this rank's mean loss over its ``n`` samples of the global batch at
        the cursor, ``n * R / size``: DDP's average over the ``R`` ranks of the weighted
        losses' gradients is the gradient of the mean over the whole global batch."""
        return n * self.sampler.num_replicas / self.current()

    def advance(self) -> None:
        """Move the sampler's cursor past the global batch at the cursor (every rank trained
        its share: the cursor counts the positions of all ranks together)."""
        self.sampler.advance_positions(self.current())
