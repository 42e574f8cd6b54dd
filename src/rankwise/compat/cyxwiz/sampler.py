"""The CyxWiz guide's ``cx.distributed.DistributedSampler`` (also ``cx.DistributedSampler``).

The guide's method-style sizes (``total_size()`` meaning N,
``local_size()``, ``padded_size()``, ``get_indices()``) clash with the attributes of torch's
``DistributedSampler`` (``total_size`` is the padded length there), so they live on this
subclass; :class:`rankwise.data.DistributedSampler` keeps torch's shape.

>>> sampler = DistributedSampler(dataset_size=10, num_replicas=4, rank=3, shuffle=False)
>>> sampler.total_size(), sampler.padded_size(), sampler.local_size(), sampler.get_indices()
(10, 12, 3, [3, 7, 1])
"""

from __future__ import annotations

from collections.abc import Callable

from rankwise.data import DistributedSampler as _CoreSampler

__all__ = ["DistributedSampler"]


class DistributedSampler(_CoreSampler):
    """rankwise's sampler with the CyxWiz guide's size methods (names only, no new logic)."""

    # torch's constructor stores the padded length as ``self.total_size``; the guide calls
    # ``total_size()`` for N. The property keeps torch's value aside and hands out the method.
    @property  # type: ignore[override]
    def total_size(self) -> Callable[[], int]:
        return self._dataset_size

    @total_size.setter
    def total_size(self, value: int) -> None:
        self._torch_total_size = int(value)

    def _dataset_size(self) -> int:
        return self._n

    def local_size(self) -> int:
        """Indices this rank gets: ``len(sampler)`` (the rest of the epoch when resumed)."""
        return len(self)

    def padded_size(self) -> int:
        """N padded up (drop_last: trimmed down) to a multiple of the world size: the whole
        epoch's length (torch's ``total_size``), also after a resume, which changes
        ``local_size()`` only. 10 samples over 4 ranks -> 12 (8 with drop_last).

        >>> s = DistributedSampler(dataset_size=10, num_replicas=4, rank=0, shuffle=False)
        >>> s.load_state_dict({**s.state_dict(), "consumed": 3})   # resumed mid-epoch
        >>> s.padded_size(), s.local_size()
        (12, 2)
        """
        return self._torch_total_size

    def get_indices(self) -> list[int]:
        """This rank's indices for the rest of the epoch, as a list (O(N/R) memory, by the
        guide's contract); not a pass, so ``len()`` is unaffected."""
        return self.rest_indices()
