"""Byte ranges: merging the ranges a read wants into the fewest requests, and cutting the
merged answers back into the ranges asked for. Pure functions, no I/O.

>>> merge_ranges([(0, 4), (4, 8), (20, 24)])
[(0, 8), (20, 24)]
>>> merge_ranges([(0, 4), (6, 8)], max_gap=2)
[(0, 8)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["merge_ranges", "split_merged"]


def merge_ranges(ranges: Sequence[tuple[int, int]], max_gap: int = 0) -> list[tuple[int, int]]:
    """The ranges ``[start, stop)`` covering ``ranges`` (in any order, overlaps allowed), two
    merged when the gap between them is at most ``max_gap`` bytes (0: only touching ones)."""
    if max_gap < 0:
        raise ValueError(f"max_gap ({max_gap}) must be >= 0 bytes.")
    merged: list[tuple[int, int]] = []
    for start, stop in sorted((int(a), int(b)) for a, b in ranges if b > a):
        if merged and start - merged[-1][1] <= max_gap:
            merged[-1] = (merged[-1][0], max(stop, merged[-1][1]))
        else:
            merged.append((start, stop))
    return merged


def split_merged(
    ranges: Sequence[tuple[int, int]],
    merged: Sequence[tuple[int, int]],
    data: Sequence[Any],
    copy: bool = True,
) -> list[Any]:
    """The bytes of each of ``ranges``, cut out of ``data``, the bytes (or buffers) of
    ``merged`` (which :func:`merge_ranges` made from them); ``copy=False``: read-only views
    into ``data`` where a range is part of a merged one, never a copy.

    >>> split_merged([(2, 4), (0, 2)], [(0, 4)], [b"abcd"])
    [b'cd', b'ab']
    """
    starts = [m[0] for m in merged]
    out: list[Any] = []
    for start, stop in ranges:
        if stop <= start:
            out.append(b"")
            continue
        # the merged range holding `start`: the last one starting at or before it
        lo, hi = 0, len(starts)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if starts[mid] <= start else (lo, mid)
        base, whole = merged[lo][0], data[lo]
        if start == base and stop - base == len(whole):
            out.append(bytes(whole) if copy and not isinstance(whole, bytes) else whole)
        else:
            view = memoryview(whole)[start - base : stop - base]
            out.append(bytes(view) if copy else view)
    return out
