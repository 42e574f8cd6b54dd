"""``DistributedBatchIterator``: this rank's indices in batches (the CyxWiz guide's API).

>>> from rankwise.data.sampler import DistributedSampler
>>> sampler = DistributedSampler(10, num_replicas=2, rank=0, shuffle=False)
>>> batches = DistributedBatchIterator(sampler, batch_size=2)
>>> while batches.has_next():
...     print(batches.next())
[0, 2]
[4, 6]
[8]
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

from rankwise.validation import check_int

__all__ = ["DistributedBatchIterator"]


class DistributedBatchIterator:
    """Consecutive batches of ``batch_size`` indices from ``sampler``, one epoch at a time.

    Every rank gets the same number of batches (the sampler gives every rank the same number
    of indices). ``drop_last`` drops a final batch shorter than ``batch_size``.

    With a rankwise :class:`~rankwise.data.DistributedSampler`, each batch :meth:`next` returns
    counts as consumed (``sampler.advance(len(batch))``), so ``sampler.state_dict()`` saved
    after a step resumes right after that batch, under any world size. A dropped tail counts
    as consumed too, so a state saved after the last batch says the epoch is finished.

    Global batches: with per-rank ``batch_size = B // R``, batch k of all ranks together is
    positions ``[kB, (k+1)B)`` of the sampler's global order, whatever R is.
    """

    def __init__(self, sampler: Any, batch_size: int, drop_last: bool = False) -> None:
        self.sampler = sampler
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.drop_last = bool(drop_last)
        self._it: Iterator[int] | None = None
        self._left = 0  # indices of this pass not yet handed out
        self._pass_size = 0  # indices in this pass when it started

    def _next_pass_size(self) -> int:
        # rankwise's sampler says what is left of the epoch; a finished epoch repeats whole
        # (torch's behaviour without set_epoch); any other sampler restarts.
        remaining = getattr(self.sampler, "remaining", None)
        if not callable(remaining):
            return len(self.sampler)
        return int(remaining()) or int(getattr(self.sampler, "num_samples", 0))

    def _prime(self) -> None:
        if self._it is None:
            self._it = iter(self.sampler)
            self._left = self._pass_size = len(self.sampler)

    def _advance(self, count: int) -> None:
        advance = getattr(self.sampler, "advance", None)
        if count and callable(advance):
            advance(count)

    def reset(self, epoch: int | None = None) -> None:
        """Start a new pass; with ``epoch``, call ``sampler.set_epoch(epoch)`` first.

        Without an epoch the pass continues the sampler's epoch from its cursor; once that
        epoch is finished, the pass repeats it (as torch does when ``set_epoch`` is not
        called) and the sampler warns: call ``reset(epoch + 1)`` for a new epoch.
        """
        if epoch is not None:
            self.sampler.set_epoch(epoch)
        self._it = None

    def has_next(self) -> bool:
        """True while :meth:`next` has a batch to give."""
        self._prime()
        if self.drop_last and 0 < self._left < self.batch_size:
            self._advance(self._left)  # the dropped tail is consumed, not pending
            self._left = 0
        return self._left > 0

    def next(self) -> list[int]:
        """The next batch of indices; raises StopIteration after the last one."""
        if not self.has_next():
            raise StopIteration
        assert self._it is not None  # primed by has_next
        batch = list(islice(self._it, min(self.batch_size, self._left)))
        self._left -= len(batch)
        self._advance(len(batch))
        return batch

    __next__ = next

    def __iter__(self) -> Iterator[list[int]]:
        while self.has_next():
            yield self.next()

    def num_batches(self) -> int:
        """Batches in the current pass: a whole epoch, or its rest when resumed mid-epoch."""
        left = self._pass_size if self._it is not None else self._next_pass_size()
        full, tail = divmod(left, self.batch_size)
        return full + (1 if tail and not self.drop_last else 0)

    def __len__(self) -> int:
        return self.num_batches()

    def __repr__(self) -> str:
        return (
            f"DistributedBatchIterator(batch_size={self.batch_size}, drop_last={self.drop_last}, "
            f"sampler={self.sampler!r})"
        )
