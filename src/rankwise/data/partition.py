"""Which positions of a sequence belong to which rank: pure functions of (N, rank, world_size).

Two splits, as the guides use them:

- contiguous (DPA): rank r gets one block ``[start, end)``; the first ``N % R`` ranks get one
  more. 23 over 4 ranks -> ``[(0, 6), (6, 12), (12, 18), (18, 23)]``; 3 over 5 ranks ->
  ``[(0, 1), (1, 2), (2, 3), (3, 3), (3, 3)]`` (two empty ranges).
- strided / round-robin (torch's sampler, scDataset): rank r gets positions ``r, r+R, r+2R...``.
  10 over 4 ranks -> rank 0 ``[0, 4, 8]``, rank 1 ``[1, 5, 9]``, rank 2 ``[2, 6]``, rank 3 ``[3, 7]``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from rankwise.distributed import detect_world
from rankwise.validation import check_int, check_rank

__all__ = [
    "DistributedRangeSplitter",
    "contiguous_owner",
    "contiguous_range",
    "global_batch_end",
    "position_chunks",
    "resolve_world",
    "strided_count",
    "strided_positions",
]


def _check(total: int, world_size: int, rank: int | None = None) -> None:
    check_int("total_samples", total)
    if rank is None:
        check_int("world_size", world_size, minimum=1)
    else:
        check_rank(rank, world_size)


def contiguous_range(total: int, world_size: int, rank: int) -> tuple[int, int]:
    """``[start, end)`` of ``rank``'s contiguous block; the first ``total % world_size`` ranks
    hold one extra item.

    >>> [contiguous_range(23, 4, r) for r in range(4)]
    [(0, 6), (6, 12), (12, 18), (18, 23)]
    """
    _check(total, world_size, rank)
    base, extra = divmod(int(total), int(world_size))
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def contiguous_owner(total: int, world_size: int, index: int) -> int:
    """The rank whose contiguous block holds ``index`` (inverse of :func:`contiguous_range`).

    >>> contiguous_owner(23, 4, 17), contiguous_owner(23, 4, 18)
    (2, 3)
    """
    _check(total, world_size)
    index = check_int("sample_id", index)  # 2.5 or True is a mistake, not sample 0
    if index >= total:
        raise ValueError(
            f"sample_id ({index}) must be in [0, {total}): ids are 0-based positions among "
            f"total_samples ({total}); pass an id below {total}."
        )
    base, extra = divmod(int(total), int(world_size))
    boundary = extra * (base + 1)  # indices below it live in the larger blocks
    if index < boundary:
        return int(index // (base + 1))
    return int(extra + (index - boundary) // base)


def strided_positions(total: int, world_size: int, rank: int, start: int = 0) -> range:
    """The strided split: positions ``start + rank, start + rank + R, ...`` below ``total``.

    The one place rankwise splits a sequence round-robin (the sampler over its global order,
    FetchDataset over its fetches). ``start`` is where the split begins -- a resume cursor --
    so the rest of an epoch re-splits over any world size. A lazy ``range``: O(1) memory,
    ``len()`` is the rank's count, slicing gives a chunk (see :func:`position_chunks`).

    >>> list(strided_positions(10, 4, 1))
    [1, 5, 9]
    >>> list(strided_positions(10, 3, 0, start=4))   # resumed after 4 positions
    [4, 7]
    """
    _check(total, world_size, rank)
    start = check_int("start", start)
    return range(start + rank, max(int(total), start), int(world_size))


def global_batch_end(start: int, total: int, world_size: int, batch: int) -> int:
    """One past the last position when ``[start, total)`` is taken a global batch of ``batch``
    positions at a time and each global batch is split strided over ``world_size`` ranks.

    ``total`` itself (no padding: every position once) unless the last, short global batch
    would hold fewer than ``world_size`` positions and leave a rank without a sample; then it
    is padded up to ``world_size`` positions (they wrap to the start of the order, torch's
    padding rule). With a world that divides ``total - start`` the last batch is a multiple
    of the world and never padded.

    >>> global_batch_end(60, 192, 2, 15)     # 132 left: 8 batches of 15 and one of 12
    192
    >>> global_batch_end(0, 31, 2, 15)       # the last batch would be 1 sample for 2 ranks
    32
    """
    _check(total, world_size)
    start, batch = check_int("start", start), check_int("batch", batch, minimum=1)
    tail = max(total - start, 0) % batch
    return total + (world_size - tail if 0 < tail < world_size else 0)


def strided_count(total: int, world_size: int, rank: int) -> int:
    """How many of ``range(total)`` a strided split gives ``rank``.

    >>> [strided_count(10, 4, r) for r in range(4)]
    [3, 3, 2, 2]
    """
    return len(strided_positions(total, world_size, rank))


def position_chunks(positions: range, chunk: int) -> Iterator[npt.NDArray[np.int64]]:
    """``positions`` as int64 arrays of at most ``chunk`` values: flat memory for any length.

    >>> [c.tolist() for c in position_chunks(range(1, 10, 2), 2)]
    [[1, 3], [5, 7], [9]]
    """
    chunk = check_int("chunk", chunk, minimum=1)
    for lo in range(0, len(positions), chunk):
        part = positions[lo : lo + chunk]
        yield np.arange(part.start, part.stop, part.step, dtype=np.int64)


def resolve_world(
    rank: int | None, world_size: int | None, world_name: str = "world_size"
) -> tuple[int, int]:
    """``(rank, world_size)`` with missing values taken from the process group (else the
    torchrun variables, else a world of one), checked: ``0 <= rank < world_size``.

    ``world_name`` is the caller's name for the world size (torch's sampler says
    ``num_replicas``), so errors quote the argument the user wrote.

    >>> resolve_world(1, 4)
    (1, 4)
    >>> resolve_world(None, None)   # no process group, no RANK / WORLD_SIZE
    (0, 1)
    """
    if rank is None or world_size is None:
        detected_rank, detected_world = detect_world()
        rank = detected_rank if rank is None else rank
        world_size = detected_world if world_size is None else world_size
    rank, world_size = check_rank(rank, world_size, world_name)
    return rank, world_size


class DistributedRangeSplitter:
    """Contiguous split of ``total_samples`` over ``world_size`` ranks (the DPA guide's API).

    >>> s = DistributedRangeSplitter(23, 4)
    >>> s.get_all_ranges()
    [(0, 6), (6, 12), (12, 18), (18, 23)]
    >>> s.get_rank_for_sample(20)
    3
    """

    def __init__(self, total_samples: int, world_size: int) -> None:
        _check(total_samples, world_size)
        self.total_samples = int(total_samples)
        self.world_size = int(world_size)

    def get_rank_range(self, rank: int) -> tuple[int, int]:
        """``(start, end)`` of ``rank``'s samples, end exclusive; empty when start == end."""
        return contiguous_range(self.total_samples, self.world_size, rank)

    def get_all_ranges(self) -> list[tuple[int, int]]:
        """Every rank's ``(start, end)`` in rank order."""
        return [self.get_rank_range(r) for r in range(self.world_size)]

    def validate_ranges(self) -> bool:
        """True when the ranges are ordered, never overlap and cover every sample exactly once."""
        expected_start = 0
        for start, end in self.get_all_ranges():
            if start != expected_start or end < start:
                return False
            expected_start = end
        return expected_start == self.total_samples

    def get_rank_for_sample(self, sample_id: int) -> int:
        """The rank whose range contains ``sample_id``."""
        return contiguous_owner(self.total_samples, self.world_size, sample_id)

    def __repr__(self) -> str:
        return f"DistributedRangeSplitter(total_samples={self.total_samples}, world_size={self.world_size})"
