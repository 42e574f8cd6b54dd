"""Orders in which a :class:`~rankwise.data.FetchDataset` visits its rows (the scDataset API).

A strategy maps the positions of an epoch's order to source row indices, as a pure function of
``(n, positions, seed, epoch)`` — so it can be computed lazily, one fetch at a time, by any
rank or worker. Add a strategy by implementing the :class:`Strategy` protocol.

>>> Streaming().order(6, np.arange(6), seed=0, epoch=0).tolist()
[0, 1, 2, 3, 4, 5]
>>> order = BlockShuffling(block_size=2).order(6, np.arange(6), seed=0, epoch=0).tolist()
>>> sorted(order) == list(range(6)) and all(order[i] // 2 == order[i + 1] // 2 for i in (0, 2, 4))
True
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from rankwise.data.permutation import cached_permutation

__all__ = ["BlockShuffling", "Strategy", "Streaming", "block_order", "check_block_size"]

IntArray = npt.NDArray[np.int64]


@runtime_checkable
class Strategy(Protocol):
    """What FetchDataset needs from a strategy.

    ``shuffle_fetch``: whether the rows of each fetch are shuffled in memory after the read.
    ``epoch_length(n)``: how many positions an epoch over an ``n``-row source has.
    ``order(n, positions, seed=, epoch=)``: the source row index at each position.
    """

    shuffle_fetch: bool

    def epoch_length(self, n: int) -> int: ...

    def order(self, n: int, positions: IntArray, *, seed: int, epoch: int) -> IntArray: ...


def subset_indices(indices: npt.ArrayLike | None) -> IntArray | None:
    if indices is None:
        return None
    arr = np.asarray(indices)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(
            f"indices must be a 1-D array of integer row indices (got shape {arr.shape}, "
            f"dtype {arr.dtype}); pass e.g. np.arange(n) or a boolean mask's np.flatnonzero()."
        )
    if arr.size and arr.min() < 0:
        raise ValueError(f"indices must be >= 0 (got {int(arr.min())}).")
    return arr.astype(np.int64)


def base_length(n: int, indices: IntArray | None) -> int:
    if indices is None:
        return n
    if indices.size and int(indices.max()) >= n:
        raise ValueError(
            f"indices reach row {int(indices.max())} but the source has only {n} rows."
        )
    return len(indices)


def check_block_size(block_size: object) -> int:
    """``block_size`` as an int >= 1, or a ValueError naming the fix."""
    if isinstance(block_size, bool) or not isinstance(block_size, int | np.integer):
        raise ValueError(f"block_size ({block_size!r}) must be an integer >= 1.")
    if block_size < 1:
        raise ValueError(
            f"block_size ({block_size}) must be >= 1; use 1 for a full row-level shuffle."
        )
    return int(block_size)


class Streaming:
    """Rows in order (of ``indices`` if given); ``shuffle=True`` shuffles within each fetch.

    >>> Streaming(indices=[5, 1, 3]).order(10, np.arange(3), seed=0, epoch=0).tolist()
    [5, 1, 3]
    """

    def __init__(self, indices: npt.ArrayLike | None = None, shuffle: bool = False) -> None:
        self.indices = subset_indices(indices)
        self.shuffle_fetch = bool(shuffle)

    def epoch_length(self, n: int) -> int:
        return base_length(n, self.indices)

    def order(self, n: int, positions: IntArray, *, seed: int, epoch: int) -> IntArray:
        return positions if self.indices is None else self.indices[positions]

    def __repr__(self) -> str:
        return f"Streaming(shuffle={self.shuffle_fetch})"


class BlockShuffling:
    """Contiguous blocks of ``block_size`` rows, in a shuffled block order; the rows of each
    fetch are shuffled again in memory. ``drop_last`` drops a final short block.

    Reads stay contiguous (one slice per block) while batches mix rows from many blocks:
    10 rows, block_size=4 -> blocks ``[0-3] [4-7] [8-9]``, visited e.g. as ``[8 9] [0 1 2 3] [4 5 6 7]``.

    >>> s = BlockShuffling(block_size=4)
    >>> s.epoch_length(10), BlockShuffling(4, drop_last=True).epoch_length(10)
    (10, 8)
    """

    shuffle_fetch = True

    def __init__(
        self, block_size: int = 8, indices: npt.ArrayLike | None = None, drop_last: bool = False
    ) -> None:
        self.block_size = check_block_size(block_size)
        self.indices = subset_indices(indices)
        self.drop_last = bool(drop_last)

    def epoch_length(self, n: int) -> int:
        m = base_length(n, self.indices)
        return m - m % self.block_size if self.drop_last else m

    def order(self, n: int, positions: IntArray, *, seed: int, epoch: int) -> IntArray:
        # Called once per fetch: no O(M) validation here (epoch_length did it, once, when the
        # dataset was built), or an epoch would cost O(M^2 / fetch size).
        m = n if self.indices is None else len(self.indices)
        rows = block_order(m, self.block_size, positions, seed, epoch, self.drop_last)
        return rows if self.indices is None else self.indices[rows]

    def __repr__(self) -> str:
        return f"BlockShuffling(block_size={self.block_size}, drop_last={self.drop_last})"


def block_order(
    m: int, block_size: int, positions: IntArray, seed: int, epoch: int, drop_last: bool = False
) -> IntArray:
    """The item of ``[0, m)`` at each epoch position when blocks of ``block_size`` consecutive
    items are visited in a shuffled order (``Permutation`` of the blocks, keyed by seed and
    epoch); a short last block takes a shuffled slot too unless ``drop_last``.

    >>> block_order(6, 2, np.arange(6), seed=1, epoch=0).tolist()   # blocks [0 1] [2 3] [4 5]
    [0, 1, 4, 5, 2, 3]
    """
    bs = block_size
    full, rem = divmod(m, bs)
    if drop_last or rem == 0:
        perm = cached_permutation(full, seed, epoch)
        return perm[positions // bs] * bs + positions % bs
    # The short last block (id `full`, `rem` items) sits at some slot of the shuffled block
    # order; positions after it are shifted back by bs - rem.
    perm = cached_permutation(full + 1, seed, epoch)
    cut = int(perm.inverse(full)) * bs
    after = positions >= cut + rem
    shifted = np.where(after, positions - rem + bs, positions)
    inside = (positions >= cut) & ~after
    slot = np.where(inside, cut // bs, shifted // bs)
    offset = np.where(inside, positions - cut, shifted % bs)
    return perm[slot] * bs + offset
