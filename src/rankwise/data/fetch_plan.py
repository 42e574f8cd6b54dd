"""Who reads what in a :class:`~rankwise.data.FetchDataset` pass, and what is left after a
stop: pure functions of ``(work, world_size, rank, worker, batches consumed)``.

**Work.** What an epoch still has to yield is a :class:`Work`: ``pieces``, the unread rest of
fetches that were begun before a stop, then the *fresh* positions ``[next, length)`` of the
strategy's order. A fresh epoch is ``Work(length, 0, ())``. Laid end to end (pieces first) the
work is a *virtual sequence* of ``total`` rows; a pass cuts it exactly like a fresh epoch:
fetches of ``batch_size * fetch_factor`` virtual positions dealt round-robin to ranks, the last
round cut into equal pieces, padding by wrapping (:func:`rank_fetches`).

**Pieces.** A piece ``(start, stop, lo, hi)`` names a fetch by the positions ``[start, stop)``
of the epoch order it covers; the fetch yields those positions in its own shuffled order
``start + sigma[0 .. stop-start)`` (``sigma`` keyed by seed, epoch and ``start``), and the piece
is entries ``[lo, hi)`` of that order. A fetch over fresh positions ``[p, q)`` is the piece
``(p, q, 0, q - p)``; after a stop its unread rest is ``(p, q, c, q - p)``, whatever ranks and
workers read it next. So any stop, in any world, leaves a flat list of pieces.

**Consumption.** Every rank consumes the same number of batches ``k`` (DDP's lockstep). Within
a rank, fetch i goes to DataLoader worker ``i % W`` and the loader hands out batches
round-robin over the workers, skipping those that ran out (:func:`delivered`), so ``k`` fixes
how far each worker got, hence the rest (:func:`fold`)::

    12 rows, R=2, batch_size=2, fetch_factor=1, W=1: rank 0 reads fetches 0-1, 4-5, 8-9
    k=1 (one batch on each rank): rows 0-1 and 2-3 consumed
    fold -> Work(12, next=4, pieces=()): the rest is the fresh positions 4..11
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from rankwise.data.partition import strided_positions

__all__ = ["Fetch", "Piece", "Work", "delivered", "fetch_pieces", "fold", "rank_fetches"]

#: ``(start, stop, lo, hi)``: entries ``[lo, hi)`` of the shuffled fetch over ``[start, stop)``.
Piece = tuple[int, int, int, int]


class Fetch(NamedTuple):
    """One sorted read: virtual positions ``[start, stop)`` of a pass (padding at >= total)."""

    fetch_id: int  # this pass's id, the same whatever worker reads it
    start: int
    stop: int


class Work(NamedTuple):
    """The rest of an epoch of ``length`` positions: ``pieces``, then ``[next, length)``.

    >>> w = Work(10, next=6, pieces=((0, 4, 3, 4),))   # one row of fetch 0-3 left, then 6..9
    >>> w.held, w.total, w.done
    (1, 5, False)
    """

    length: int
    next: int
    pieces: tuple[Piece, ...] = ()

    @property
    def held(self) -> int:
        """Rows left in the pieces."""
        return sum(hi - lo for _, _, lo, hi in self.pieces)

    @property
    def total(self) -> int:
        """Rows left in the epoch: the length of this pass's virtual sequence."""
        return self.held + self.length - self.next

    @property
    def done(self) -> bool:
        return self.total == 0


def rows_per_rank(length: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """Rows each rank reads in a pass of ``length`` virtual positions.

    >>> rows_per_rank(10, 4, 2, False), rows_per_rank(10, 4, 2, True)
    (3, 2)
    """
    if drop_last:
        return (length // world_size) // batch_size * batch_size
    return -(-length // world_size)


def rank_fetches(
    length: int,
    world_size: int,
    rank: int,
    batch_size: int,
    fetch_factor: int,
    drop_last: bool = False,
) -> list[Fetch]:
    """The fetches ``rank`` reads, in order: full fetches round-robin, then an equal piece of
    the last round. Positions >= ``length`` wrap (padding).

    >>> rank_fetches(10, 2, 1, batch_size=2, fetch_factor=2)
    [Fetch(fetch_id=1, start=4, stop=8), Fetch(fetch_id=3, start=9, stop=10)]
    """
    size = batch_size * fetch_factor
    m = rows_per_rank(length, world_size, batch_size, drop_last)
    rounds, rest = divmod(m, size)
    out = [
        Fetch(g, g * size, (g + 1) * size)
        for g in strided_positions(rounds * world_size, world_size, rank)
    ]
    if rest:
        base = rounds * world_size * size
        out.append(Fetch(rounds * world_size + rank, base + rank * rest, base + (rank + 1) * rest))
    return out


def pieces_between(work: Work, lo: int, hi: int) -> list[Piece]:
    """Virtual positions ``[lo, hi)`` of ``work`` as pieces, in yield order (fresh positions
    become one new fetch over them).

    >>> pieces_between(Work(10, 6, ((0, 4, 2, 4),)), 1, 4)
    [(0, 4, 3, 4), (6, 8, 0, 2)]
    """
    out: list[Piece] = []
    offset = 0
    for start, stop, a, b in work.pieces:
        x, y = max(lo, offset), min(hi, offset + b - a)
        if x < y:
            out.append((start, stop, a + x - offset, a + y - offset))
        offset += b - a
    x, y = max(lo, offset), hi
    if x < y:
        p, q = work.next + x - offset, work.next + y - offset
        out.append((p, q, 0, q - p))
    return out


def fetch_pieces(work: Work, fetch: Fetch) -> tuple[list[Piece], list[Piece]]:
    """``(real, padding)``: the pieces ``fetch`` yields, in order; padding (positions past the
    work's total) wraps to the start of the virtual sequence and is yielded last."""
    total = work.total
    real = pieces_between(work, fetch.start, min(fetch.stop, total))
    padding: list[Piece] = []
    lo = max(fetch.start, total)
    while lo < fetch.stop:
        a = lo % total
        b = min(total, a + fetch.stop - lo)
        padding += pieces_between(work, a, b)
        lo += b - a
    return real, padding


def delivered(counts: Sequence[int], k: int) -> list[int]:
    """Batches each DataLoader worker has handed out once the loader yielded ``k``.

    torch's loader (``in_order=True``, the default) asks workers in turn, 0, 1, ..., W-1, 0,
    ..., and skips a worker once it has run out, so it yields batch t of worker w before batch
    t of worker w+1 and before batch t+1 of any worker.

    >>> delivered([3, 1, 2], 4), delivered([3, 1, 2], 6)
    ([2, 1, 1], [3, 1, 2])
    """

    def upto(t: int) -> int:  # batches yielded by the first t turns of every worker
        return sum(min(c, t) for c in counts)

    if k > upto(max(counts, default=0)):
        raise ValueError(f"{k} batches consumed, but the workers hold only {sum(counts)}.")
    lo, hi = 0, max(counts, default=0)
    while lo < hi:  # the last t whose full turns fit in k
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if upto(mid) <= k else (lo, mid - 1)
    out = [min(c, lo) for c in counts]
    extra = k - upto(lo)
    for w, c in enumerate(counts):
        if extra and c > lo:
            out[w] += 1
            extra -= 1
    return out


def worker_fetches(plan: list[Fetch], worker: int, num_workers: int) -> list[Fetch]:
    """The fetches of a rank's ``plan`` that DataLoader worker ``worker`` reads: i % W == w."""
    return [plan[i] for i in strided_positions(len(plan), num_workers, worker)]


def _consumed_rows(
    work: Work,
    world_size: int,
    num_workers: int,
    batches: int,
    batch_size: int,
    fetch_factor: int,
    drop_last: bool,
) -> list[tuple[Fetch, int]]:
    """Every rank's fetches with the rows consumed from each after ``batches`` per rank."""
    out = []
    for rank in range(world_size):
        plan = rank_fetches(work.total, world_size, rank, batch_size, fetch_factor, drop_last)
        per_worker = [worker_fetches(plan, w, num_workers) for w in range(num_workers)]
        counts = [sum(-(-(f.stop - f.start) // batch_size) for f in fs) for fs in per_worker]
        for fs, left in zip(per_worker, delivered(counts, batches), strict=True):
            for f in fs:
                size = f.stop - f.start
                take = min(left, -(-size // batch_size))
                left -= take
                out.append((f, min(size, take * batch_size)))
    return out


def fold(
    work: Work,
    world_size: int,
    num_workers: int,
    batches: int,
    batch_size: int,
    fetch_factor: int,
    drop_last: bool = False,
) -> Work:
    """The work left once every rank consumed ``batches`` batches of a pass over ``work``.

    Fetches begun (and any fetch reaching into the pieces) leave their unread rest as pieces;
    fresh positions after the last begun fetch stay fresh. Padding is never carried over, and a
    finished pass finishes the epoch (a ``drop_last`` tail is dropped, not carried).

    >>> fold(Work(12, 0), 2, 1, 1, batch_size=2, fetch_factor=1)
    Work(length=12, next=4, pieces=())
    >>> fold(Work(12, 0), 1, 1, 1, batch_size=2, fetch_factor=2)   # half of fetch 0-3 read
    Work(length=12, next=4, pieces=((0, 4, 2, 4),))
    """
    total, held = work.total, work.held
    per_rank = -(-rows_per_rank(total, world_size, batch_size, drop_last) // batch_size)
    if batches >= per_rank:  # the pass is over: what drop_last left out is dropped for good
        return Work(work.length, work.length)
    fetches = sorted(
        _consumed_rows(work, world_size, num_workers, batches, batch_size, fetch_factor, drop_last),
        key=lambda fc: fc[0].start,  # all ranks' fetches, back in virtual order
    )
    real = [(f, c) for f, c in fetches if f.start < total]
    cut = held  # virtual end of what is carried as pieces
    for f, c in real:
        if c or f.start < held:
            cut = max(cut, min(f.stop, total))
    pieces: list[Piece] = []
    covered = 0
    for f, c in real:
        if f.start >= cut:
            break
        covered = max(covered, min(f.stop, total))
        for start, stop, lo, hi in pieces_between(work, f.start, min(f.stop, total)):
            skip = min(c, hi - lo)
            c -= skip
            if lo + skip < hi:
                pieces.append((start, stop, lo + skip, hi))
    if covered < cut:  # drop_last left the pieces' tail unread: carry it
        pieces += pieces_between(work, covered, cut)
    return Work(work.length, work.next + max(0, cut - held), _merge(pieces))


def _merge(pieces: list[Piece]) -> tuple[Piece, ...]:
    out: list[Piece] = []
    for p in pieces:
        if out and out[-1][:2] == p[:2] and out[-1][3] == p[2]:
            out[-1] = (p[0], p[1], out[-1][2], p[3])
        else:
            out.append(p)
    return tuple(out)
