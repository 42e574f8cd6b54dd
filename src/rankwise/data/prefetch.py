"""Reading the next fetches ahead of use, from the known plan, under a byte cap.

A FetchDataset's plan says every fetch a DataLoader worker will read, so the worker can have
the next ones on the wire while the model consumes the current one. :func:`prefetched` keeps
reads in plan order and bounds what is read ahead: the fetches in flight or waiting, beside
the one being handed out, never hold more than ``cap`` bytes together (a fetch larger than
the cap is read alone, with nothing ahead of it)::

    cap 10, fetch sizes 4 4 4 4: fetches 0-1 in flight (8 <= 10), 2 waits for 0 to be used

>>> list(prefetched(lambda n: n * 10, [(1, 4), (2, 4), (3, 4)], cap=8))
[10, 20, 30]
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["PrefetchStats", "prefetched"]

K = TypeVar("K")
T = TypeVar("T")

# Reads running at once in one worker (each read_ranges call has many GETs in flight itself).
THREADS = 4
# New reads one fill may start. Each costs the iterating thread its fetch's plan (the rows and
# their bytes: ~1-2 ms), so the window grows by a few fetches per fetch handed out instead of
# being planned whole (18 fetches, ~40 ms in a DataLoader worker) before the first batch.
STEP = 2


class PrefetchStats:
    """What a :func:`prefetched` run held: ``peak_ahead`` is the most bytes read ahead at once
    (never above the cap), ``reads`` how many fetches it read."""

    def __init__(self) -> None:
        self.peak_ahead = 0
        self.reads = 0


def prefetched(
    read: Callable[[K], T],
    plan: Iterable[tuple[K, int]],
    cap: int,
    *,
    threads: int = THREADS,
    stats: PrefetchStats | None = None,
) -> Generator[T, None, None]:
    """``read(key)`` for each ``(key, nbytes)`` of ``plan``, in order, the next ones read in
    background threads while at most ``cap`` bytes are ahead of the one handed out. The
    threads start on the first ``next()`` (in the process that iterates: a DataLoader
    worker) and stop when the iterator is exhausted or closed; a read's error is raised
    where its result is due. ``plan`` is drawn lazily, at most ``STEP`` new reads per refill,
    so the first result does not wait for the whole window to be planned."""
    if cap < 0:
        raise ValueError(f"prefetch_bytes ({cap}) must be >= 0 (0: no read-ahead).")
    stats = stats if stats is not None else PrefetchStats()
    pending: collections.deque[tuple[Future[T], int]] = collections.deque()
    upcoming = iter(plan)
    following = next(upcoming, None)
    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="rankwise-fetch")
    started = False  # the first fetch is read alone: the read-ahead must not delay it

    def fill() -> None:
        nonlocal following
        ahead, added = sum(n for _, n in pending), 0
        while following is not None and (
            not pending or (started and added < STEP and ahead + following[1] <= cap)
        ):
            pending.append((pool.submit(read, following[0]), following[1]))
            ahead += following[1]
            added += 1
            following = next(upcoming, None)
        if len(pending) > 1:
            stats.peak_ahead = max(stats.peak_ahead, ahead)

    try:
        while following is not None or pending:
            fill()
            future, _ = pending.popleft()
            result = future.result()
            started = True
            fill()  # the next fetches go on the wire before this one is handed out
            stats.reads += 1
            yield result
    finally:
        for future, _ in pending:
            future.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
