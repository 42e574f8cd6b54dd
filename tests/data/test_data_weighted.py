"""BlockWeightedSampling and ClassBalancedSampling: draws by weight, deterministic from seed and
epoch, the same whatever the world size, equal batch counts on every rank, and a resumable
FetchDataset state. Pure: worlds are simulated without processes."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwise.data import BlockWeightedSampling, ClassBalancedSampling, FetchDataset
from rankwise.data.weighted import class_balance_weights, uniforms


def epoch_rows(strategy: Any, n: int, seed: int = 0, epoch: int = 0) -> list[int]:
    length = strategy.epoch_length(n)
    return strategy.order(n, np.arange(length), seed=seed, epoch=epoch).tolist()


def world_rows(strategy: Any, n: int, world: int, **kw: Any) -> tuple[list[int], list[int]]:
    """Every rank's rows of one epoch, and each rank's batch count."""
    rows, counts = [], []
    for rank in range(world):
        ds = FetchDataset(np.arange(n), strategy, rank=rank, world_size=world, **kw)
        batches = list(ds)
        assert len(batches) == len(ds)
        counts.append(len(batches))
        rows += [int(v) for b in batches for v in b]
    return rows, counts


# ---------------------------------------------------------------------------- the draws


def test_frequencies_follow_the_weights() -> None:
    weights = np.array([1.0, 2.0, 3.0, 4.0, 0.0])
    s = BlockWeightedSampling(block_size=16, weights=weights, total_size=200_000)
    counts = np.bincount(s.draws(5, seed=3, epoch=0), minlength=5) / 200_000
    assert counts[4] == 0  # a zero weight is never drawn
    np.testing.assert_allclose(counts, weights / weights.sum(), atol=0.005)


def test_uniform_without_weights_and_default_total() -> None:
    s = BlockWeightedSampling(block_size=4)
    assert s.epoch_length(10) == 10
    counts = np.bincount(BlockWeightedSampling(total_size=100_000).draws(10, 0, 0), minlength=10)
    np.testing.assert_allclose(counts / 100_000, 0.1, atol=0.005)


def test_deterministic_per_seed_and_epoch_and_ordered_by_row() -> None:
    s = BlockWeightedSampling(block_size=4, weights=np.arange(1, 101), total_size=500)
    a = s.draws(100, seed=1, epoch=2)
    assert (a == BlockWeightedSampling(4, None, np.arange(1, 101), 500).draws(100, 1, 2)).all()
    assert (np.diff(a) >= 0).all()  # sorted: a block is a run of nearby rows
    assert (a != s.draws(100, seed=1, epoch=3)).any()
    assert (a != s.draws(100, seed=2, epoch=2)).any()
    # seed 0 epoch 1 is not seed 1 epoch 0 (never seed + epoch)
    assert (s.draws(100, 0, 1) != s.draws(100, 1, 0)).any()


def test_uniforms_are_pinned() -> None:
    # Golden values: a change to the hash changes every saved epoch (bump ORDER_VERSION).
    assert uniforms(0, 0, 0, 3).round(6).tolist() == [0.230609, 0.881225, 0.875958]
    s = BlockWeightedSampling(block_size=2, weights=[1, 2, 3, 4], total_size=8)
    assert epoch_rows(s, 4) == [3, 3, 1, 2, 2, 3, 0, 1]
    assert np.histogram(uniforms(7, 1, 0, 100_000), bins=10, range=(0, 1))[0].min() > 9_500


def test_without_replacement_rounds_hold_distinct_rows() -> None:
    s = BlockWeightedSampling(
        block_size=2, weights=[5, 1, 1, 1, 1, 1, 0], total_size=12, replace=False, sampling_size=6
    )
    draws = s.draws(7, seed=0, epoch=0)
    # two rounds of the six positive rows, each once: every positive row exactly twice
    assert Counter(draws.tolist()) == {r: 2 for r in range(6)}


def test_without_replacement_favours_heavy_rows() -> None:
    weights = [50.0] + [1.0] * 99
    s = BlockWeightedSampling(weights=weights, total_size=10_000, replace=False, sampling_size=2)
    counts = Counter(s.draws(100, seed=0, epoch=0).tolist())
    # successive sampling: P(row 0 in a round) = 50/149 + 99/149 * 50/148 = 0.5601
    assert counts[0] / 5_000 == pytest.approx(50 / 149 + 99 / 149 * 50 / 148, abs=0.02)
    assert max(c for r, c in counts.items() if r) < 0.05 * 10_000


def test_indices_with_full_or_subset_weights() -> None:
    full = np.zeros(10)
    full[[2, 7]] = 1.0
    s = BlockWeightedSampling(indices=[2, 5, 7], weights=full, total_size=50)
    assert set(s.draws(10, 0, 0).tolist()) == {2, 7}
    per_index = BlockWeightedSampling(indices=[2, 5, 7], weights=[0, 1, 0], total_size=5)
    assert per_index.draws(10, 0, 0).tolist() == [5] * 5


def test_class_balanced_sampling_balances_classes() -> None:
    labels = np.array([0] * 900 + [1] * 90 + [2] * 10)
    s = ClassBalancedSampling(labels, block_size=8, total_size=30_000)
    counts = np.bincount(labels[s.draws(1000, seed=0, epoch=0)], minlength=3) / 30_000
    np.testing.assert_allclose(counts, 1 / 3, atol=0.02)
    assert class_balance_weights(["a", "b", "b"]).tolist() == [1.0, 0.5, 0.5]


def test_class_balanced_global_vs_subset_labels() -> None:
    labels = np.array([0] * 90 + [1] * 10)
    subset = [0, 1, 90, 91, 92, 93, 94, 95, 96, 97]  # 2 of class 0, 8 of class 1
    glob = ClassBalancedSampling(labels, indices=subset, total_size=20_000)
    class1 = np.mean(labels[glob.draws(100, 0, 0)] == 1)
    # global weights 1/90 vs 1/10: class 1 gets 8/10 / (8/10 + 2/90) of the draws
    assert class1 == pytest.approx((8 / 10) / (8 / 10 + 2 / 90), abs=0.02)
    local = ClassBalancedSampling(labels[subset], indices=subset, total_size=20_000)
    assert np.mean(labels[local.draws(100, 0, 0)] == 1) == pytest.approx(0.5, abs=0.02)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: BlockWeightedSampling(weights=[1, -1]),
            r"finite and >= 0, but weights\[1\] is -1",
        ),
        (
            lambda: BlockWeightedSampling(weights=[1, 2, np.nan, -1]),
            r"weights\[2\] is nan \(2 such entries\)",
        ),
        (lambda: BlockWeightedSampling(weights=[np.inf]), r"weights\[0\] is inf"),
        (lambda: BlockWeightedSampling(weights=[0, 0]), "sum to 0"),
        (lambda: BlockWeightedSampling(block_size=0), r"block_size \(0\) must be >= 1"),
        (lambda: BlockWeightedSampling(replace=False), "needs sampling_size"),
        (lambda: BlockWeightedSampling(total_size=-1), r"total_size \(-1\) must be >= 0"),
        (lambda: ClassBalancedSampling([]), "non-empty"),
        (lambda: ClassBalancedSampling([0, 1], indices=[0, 1, 2]), "fewer than the 3 indices"),
    ],
)
def test_bad_arguments_name_the_fix(make: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_sizes_are_refused_when_the_dataset_is_built() -> None:
    with pytest.raises(ValueError, match=r"weights has 3 entries .* the source's 5 rows"):
        FetchDataset(np.arange(5), BlockWeightedSampling(weights=[1, 1, 1]), batch_size=2)
    # Labels are checked as labels, not as the weights derived from them.
    with pytest.raises(ValueError, match=r"^labels has 3 entries .* the source's 5 rows"):
        FetchDataset(np.arange(5), ClassBalancedSampling([0, 1, 0]), batch_size=2)
    subset = ClassBalancedSampling([0, 1, 0], indices=[0, 1])
    with pytest.raises(ValueError, match=r"^labels has 3 entries .* 5 rows or the 2 indices"):
        FetchDataset(np.arange(5), subset, batch_size=2)
    few = BlockWeightedSampling(weights=[1, 1, 0, 0], replace=False, sampling_size=3)
    with pytest.raises(ValueError, match="only 2 rows have a positive weight"):
        FetchDataset(np.arange(4), few, batch_size=2)
    with pytest.warns(UserWarning, match="sampling_size .* is ignored with replace=True"):
        BlockWeightedSampling(sampling_size=3)


# ------------------------------------------------------------------- ranks and batches


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 60),
    total=st.integers(0, 300),
    block=st.integers(1, 9),
    world=st.integers(1, 6),
    batch=st.integers(1, 7),
    fetch=st.integers(1, 4),
    replace=st.booleans(),
    seed=st.integers(0, 2**40),
)
def test_every_rank_gets_the_same_batches_and_the_epoch_is_world_size_invariant(
    n: int,
    total: int,
    block: int,
    world: int,
    batch: int,
    fetch: int,
    replace: bool,
    seed: int,
) -> None:
    weights = (np.arange(n) % 3).astype(float) + (np.arange(n) == 0)  # some zeros
    size = None if replace else min(n, int(np.count_nonzero(weights)))
    s = BlockWeightedSampling(block, None, weights, total, replace, size)
    order = epoch_rows(s, n, seed=seed)
    assert sorted(order) == s.draws(n, seed, 0).tolist()  # the epoch visits every draw once
    rows, counts = world_rows(s, n, world, batch_size=batch, fetch_factor=fetch, seed=seed)
    assert len(set(counts)) == 1, f"unequal batch counts {counts} would hang DDP"
    # Every draw is read once; the only extras are the padding of the last round (< world).
    extra = Counter(rows) - Counter(order)
    assert not Counter(order) - Counter(rows)
    assert sum(extra.values()) == len(rows) - total < world


def test_resume_on_another_world_reads_each_draw_once() -> None:
    s = ClassBalancedSampling(np.arange(40) % 4 == 0, block_size=4, total_size=90)
    kw: dict[str, Any] = {"batch_size": 3, "fetch_factor": 2, "seed": 5}
    order = Counter(epoch_rows(s, 40, seed=5))
    seen: list[int] = []
    state = None
    for world, take in [(3, 4), (2, None)]:
        states = []
        for rank in range(world):
            ds = FetchDataset(np.arange(40), s, rank=rank, world_size=world, **kw)
            if state is not None:
                ds.load_state_dict(state)
            batches = list(ds)
            k = len(batches) if take is None else take
            seen += [int(v) for b in batches[:k] for v in b]
            ds.advance(k)
            states.append(ds.state_dict())
        assert all(st_ == states[0] for st_ in states)
        state = states[0]
    assert state is not None and state["consumed"] == 90
    assert not order - Counter(seen)  # nothing missed
    assert sum((Counter(seen) - order).values()) < 2  # only the last world's padding
