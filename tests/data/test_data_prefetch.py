"""rankwise.data.prefetch.prefetched as a whole property: whatever the fetch sizes, the cap
and the threads, every read is handed out once and in plan order, a read's error comes where
its result was due (after every earlier result), the bytes read ahead never pass the cap, and
the plan is drawn lazily: each fetch handed out has cost at most a few plan items more (the
plan of a fetch is its rows: milliseconds each, in the thread that iterates)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwise.data.prefetch import STEP, PrefetchStats, prefetched


class Boom(Exception):
    pass


@given(
    sizes=st.lists(st.integers(0, 50), max_size=30),
    cap=st.integers(0, 120),
    threads=st.integers(1, 4),
    fail_at=st.none() | st.integers(0, 29),
)
@settings(max_examples=80, deadline=None)
def test_in_order_once_under_the_cap_errors_in_place_and_the_plan_drawn_lazily(
    sizes: list[int], cap: int, threads: int, fail_at: int | None
) -> None:
    drawn = 0
    lock = threading.Lock()
    reads: list[int] = []

    def plan():
        nonlocal drawn
        for key, nbytes in enumerate(sizes):
            drawn += 1
            yield key, nbytes

    def read(key: int) -> int:
        with lock:
            reads.append(key)
        if key == fail_at:
            raise Boom(key)
        return key * 10

    stats = PrefetchStats()
    got: list[int] = []
    drawn_when: list[int] = []
    fails = fail_at is not None and fail_at < len(sizes)
    with pytest.raises(Boom) if fails else _nothing():
        for result in prefetched(read, plan(), cap, threads=threads, stats=stats):
            got.append(result)
            drawn_when.append(drawn)
    expected = list(range(fail_at if fails else len(sizes)))
    assert got == [k * 10 for k in expected]
    assert len(reads) == len(set(reads))  # none read twice
    assert stats.peak_ahead <= cap
    # The k-th fetch handed out (0-based) has drawn at most 1 + STEP items for the first (it
    # is read alone, then the read-ahead starts), 2 * STEP more per fetch after it, and the
    # one item looked ahead: never the whole window before the first batch.
    for k, n in enumerate(drawn_when):
        assert n <= 2 + STEP + 2 * STEP * k, (k, n, drawn_when)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def test_a_negative_cap_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"prefetch_bytes \(-1\) must be >= 0"):
        next(prefetched(lambda k: k, [(0, 1)], -1))
