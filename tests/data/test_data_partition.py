"""Contiguous and strided splits: the guide's examples, errors, and simulated worlds of 1..64."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankwise.data import (
    DistributedRangeSplitter,
    contiguous_owner,
    contiguous_range,
    strided_count,
    strided_positions,
)
from rankwise.data.partition import position_chunks


def test_guide_examples() -> None:
    assert DistributedRangeSplitter(23, 4).get_all_ranges() == [(0, 6), (6, 12), (12, 18), (18, 23)]
    assert DistributedRangeSplitter(100, 4).get_rank_range(3) == (75, 100)
    assert DistributedRangeSplitter(3, 5).get_all_ranges() == [
        (0, 1),
        (1, 2),
        (2, 3),
        (3, 3),
        (3, 3),
    ]
    assert DistributedRangeSplitter(0, 2).get_all_ranges() == [(0, 0), (0, 0)]


def test_strided_example() -> None:
    assert [list(strided_positions(10, 4, r)) for r in range(4)] == [
        [0, 4, 8],
        [1, 5, 9],
        [2, 6],
        [3, 7],
    ]
    assert [strided_count(10, 4, r) for r in range(4)] == [3, 3, 2, 2]
    assert strided_count(2, 5, 4) == 0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: DistributedRangeSplitter(10, 4).get_rank_range(4),
            r"rank \(4\) must be < world_size \(4\)",
        ),
        (lambda: DistributedRangeSplitter(10, 4).get_rank_range(-1), r"rank \(-1\)"),
        (lambda: DistributedRangeSplitter(10, 0), r"world_size \(0\)"),
        (lambda: DistributedRangeSplitter(-1, 2), r"total_samples \(-1\)"),
        (lambda: DistributedRangeSplitter(10, 2).get_rank_for_sample(10), r"sample_id \(10\)"),
        (lambda: strided_positions(10, 2, 2), r"rank \(2\)"),
        (lambda: strided_positions(10, 2, 0, start=-1), r"start \(-1\)"),
        (lambda: list(position_chunks(range(3), 0)), r"chunk \(0\)"),
        (lambda: contiguous_range(10, True, 0), r"world_size \(True\)"),
    ],
)
def test_bad_input_names_value(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


@given(st.integers(0, 2000), st.integers(1, 64))
def test_contiguous_covers_once_and_balances(total: int, world: int) -> None:
    s = DistributedRangeSplitter(total, world)
    assert s.validate_ranges()
    sizes = [end - start for start, end in s.get_all_ranges()]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the first N % R ranks hold the extra one
    for sample in {0, total // 3, total - 1} - {-1}:
        if 0 <= sample < total:
            start, end = s.get_rank_range(s.get_rank_for_sample(sample))
            assert start <= sample < end


@given(st.integers(0, 2000), st.integers(1, 64))
def test_strided_covers_once(total: int, world: int) -> None:
    seen = sorted(p for r in range(world) for p in strided_positions(total, world, r))
    assert seen == list(range(total))
    assert sum(strided_count(total, world, r) for r in range(world)) == total


@given(st.integers(0, 2000), st.integers(0, 2100), st.integers(1, 16), st.integers(1, 50))
def test_strided_from_a_cursor_covers_the_rest_once(
    total: int, start: int, world: int, chunk: int
) -> None:
    # A resume: the rest of the sequence after `start` re-splits over any world size, and the
    # chunks of a rank's positions join up to exactly its positions.
    parts = [strided_positions(total, world, r, start=start) for r in range(world)]
    assert sorted(p for part in parts for p in part) == list(range(start, total))
    for part in parts:
        chunks = list(position_chunks(part, chunk))
        assert all(c.size <= chunk for c in chunks)
        joined = [int(p) for c in chunks for p in c]
        assert joined == list(part)


def test_owner_every_index_small_worlds() -> None:
    for total in range(0, 40):
        for world in range(1, 9):
            for index in range(total):
                start, end = contiguous_range(total, world, contiguous_owner(total, world, index))
                assert start <= index < end


def test_validate_ranges_detects_a_bad_split(monkeypatch: pytest.MonkeyPatch) -> None:
    s = DistributedRangeSplitter(10, 2)
    assert s.validate_ranges()
    for bad in ([(0, 6), (5, 10)], [(0, 4), (5, 10)], [(0, 5), (5, 9)]):  # overlap, gap, short
        monkeypatch.setattr(s, "get_all_ranges", lambda bad=bad: bad)
        assert not s.validate_ranges()


@pytest.mark.parametrize("bad", [2.5, True, -1, 23])
def test_rank_for_sample_rejects_non_samples(bad: object) -> None:
    with pytest.raises(ValueError, match="sample_id"):
        DistributedRangeSplitter(23, 4).get_rank_for_sample(bad)  # type: ignore[arg-type]
