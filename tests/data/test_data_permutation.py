"""The O(1)-memory permutation: a true bijection, keyed by (seed, epoch), well mixed."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwise.data import Permutation, permutation_keys
from rankwise.data.permutation import ORDER_VERSION, cached_permutation

SIZES = [1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 64, 127, 1000, 4096, 4097, 8191, 8192, 65537, 100_003]


@pytest.mark.parametrize("n", SIZES)
def test_is_a_permutation_and_inverse(n: int) -> None:
    perm = Permutation(n, seed=7, epoch=3)
    order = perm.take(0, n)
    assert np.array_equal(np.sort(order), np.arange(n))
    assert np.array_equal(perm.inverse(order), np.arange(n))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 20_000), st.integers(0, 2**70), st.integers(0, 2**63 - 1))
def test_bijection_property(n: int, seed: int, epoch: int) -> None:
    perm = Permutation(n, seed, epoch)
    order = perm.take(0, n)
    assert np.array_equal(np.sort(order), np.arange(n))
    assert np.array_equal(perm.inverse(order), np.arange(n))


# The first indices of a few orders, pinned: any change to the algorithm (keys, rounds, round
# function, domain) moves them, and must come with a new ORDER_VERSION so that old checkpoints
# are refused instead of resumed on another order. Pure integer maths written in rankwise, so
# a numpy or torch upgrade must never move them.
GOLDEN = {
    (1, 0, 0): [0],
    (5, 0, 0): [3, 4, 2, 0, 1],
    (5, 1, 0): [0, 4, 1, 2, 3],
    (5, 0, 1): [1, 0, 4, 3, 2],
    (4096, 0, 0): [497, 2927, 3429, 2378, 211, 9, 1061, 897],
    (4096, 42, 7): [3160, 2, 3990, 556, 3916, 746, 2543, 3008],
    (10**6, 0, 0): [410068, 454297, 578005, 625725, 756686, 193327, 877942, 337967],
    (10**6, 1, 2): [79584, 624135, 345156, 313309, 997730, 841139, 95565, 216059],
    (10**9, 0, 0): [
        290203343, 443309190, 129304740, 270759266, 317229822, 591694616, 810184916, 193934360,
    ],
    (10**9, 123, 4): [
        287041022, 631698626, 203031465, 122409148, 679490445, 734231713, 798614617, 112229216,
    ],
}  # fmt: skip


@pytest.mark.parametrize(("n", "seed", "epoch"), sorted(GOLDEN))
def test_golden_orders_of_version_1(n: int, seed: int, epoch: int) -> None:
    assert ORDER_VERSION == 1  # bump together with the golden values, never one alone
    assert Permutation(n, seed, epoch).take(0, 8).tolist() == GOLDEN[(n, seed, epoch)]


def test_golden_keys() -> None:
    assert permutation_keys(0, 0)[:2] == (0xAF2D7BCAB9EBD5DE, permutation_keys(0, 0)[1])
    assert len(permutation_keys(0, 0)) == 6


@pytest.mark.parametrize("n", [1, 5, 64, 65, 4096])
def test_small_n_table_is_the_network_walked(n: int) -> None:
    # Small n is served from a table; it must hold exactly the cycle-walked network.
    perm = Permutation(n, seed=5, epoch=9)
    positions = np.arange(n, dtype=np.uint64)
    assert np.array_equal(perm.take(0, n), perm._walk(positions, perm._forward))
    assert np.array_equal(perm.inverse(np.arange(n)), perm._walk(positions, perm._backward))


def test_strided_and_chunked_views_agree() -> None:
    perm = Permutation(50_000, seed=1, epoch=2)
    full = perm.take(0, 50_000)
    assert np.array_equal(perm.take(3, 50_000, 7), full[3::7])
    assert np.array_equal(np.concatenate(list(perm.chunks(5, 50_000, 3, chunk=1000))), full[5::3])
    assert perm[123] == full[123] and perm[np.array([[1, 2], [3, 4]])].shape == (2, 2)


def test_keyed_by_seed_and_epoch_without_collision() -> None:
    n = 10_000
    a = Permutation(n, seed=0, epoch=1).take(0, n)
    b = Permutation(n, seed=1, epoch=0).take(0, n)
    c = Permutation(n, seed=0, epoch=0).take(0, n)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.array_equal(c, Permutation(n, seed=0, epoch=0).take(0, n))  # deterministic
    assert permutation_keys(0, 1) != permutation_keys(1, 0)
    small = [tuple(Permutation(6, s, 0).take(0, 6)) for s in range(40)]
    assert len(set(small)) > 30  # small n is keyed too


@pytest.mark.parametrize(("n", "seed"), [(100_003, 0), (100_003, 1), (65_536, 5), (3000, 2)])
def test_well_mixed(n: int, seed: int) -> None:
    order = Permutation(n, seed=seed, epoch=0).take(0, n).astype(np.float64)
    pos = np.arange(n, dtype=np.float64)
    bound = 5 / np.sqrt(n)  # ~5 sigma for an independent uniform shuffle
    assert abs(np.corrcoef(pos, order)[0, 1]) < bound  # Spearman: values are ranks already
    assert abs(np.corrcoef(order[:-1], order[1:])[0, 1]) < bound  # neighbours unrelated
    displacement = np.abs(order - pos).mean() / n  # E|U - V| = 1/3 for independent uniforms
    assert abs(displacement - 1 / 3) < 0.01
    # every decile of positions spreads over every decile of values
    counts = np.histogram2d(pos, order, bins=10)[0]
    expected = n / 100
    assert np.all(np.abs(counts - expected) < 6 * np.sqrt(expected))


def test_small_n_is_close_to_uniform() -> None:
    # All 24 orders of 4 items occur, with even odds (100 each expected; a 4-round network on
    # 1-bit halves gave 67..124 over 24 * 100 epochs; chi-square per degree of freedom 8).
    counts: dict[tuple[int, ...], int] = {}
    for epoch in range(2400):
        key = tuple(Permutation(4, seed=3, epoch=epoch).take(0, 4).tolist())
        counts[key] = counts.get(key, 0) + 1
    observed = np.array(list(counts.values()), dtype=np.float64)
    assert len(counts) == 24 and observed.min() > 60 and observed.max() < 140
    chi2 = ((observed - 100) ** 2 / 100).sum()
    assert chi2 < 55  # 23 degrees of freedom: P(chi2 > 55) < 0.001 for a uniform shuffle


@pytest.mark.parametrize("n", [2, 3, 5, 7, 16, 33, 100])
def test_small_n_has_no_fixed_point_or_position_bias(n: int) -> None:
    # A uniform shuffle has 1 fixed point on average and sends each position to each value
    # with probability 1/n. Four rounds on small domains showed 1.19 fixed points at n=5.
    epochs = 4000
    counts = np.zeros((n, n))
    fixed = 0
    for epoch in range(epochs):
        order = Permutation(n, seed=11, epoch=epoch).take(0, n)
        counts[np.arange(n), order] += 1
        fixed += int((order == np.arange(n)).sum())
    assert abs(fixed / epochs - 1) < 5 / np.sqrt(epochs)  # variance of the count is 1
    expected = epochs / n
    chi2 = ((counts - expected) ** 2 / expected).sum()
    dof = (n - 1) ** 2
    assert chi2 < dof + 5 * np.sqrt(2 * dof)  # ~5 sigma above its mean


def test_large_n_starts_at_once_in_small_memory() -> None:
    n = 10**12
    tracemalloc.start()
    perm = Permutation(n, seed=1, epoch=1)
    values = perm.take(n - 1000, n)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2_000_000
    assert values.min() >= 0 and values.max() < n and len(set(values.tolist())) == 1000
    assert np.array_equal(perm.inverse(values), np.arange(n - 1000, n))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: Permutation(-1), r"n \(-1\)"),
        (lambda: Permutation(10, seed=-3), r"seed \(-3\)"),
        (lambda: Permutation(10, epoch=1.5), r"epoch \(1.5\)"),
        (lambda: Permutation(10)[10], r"\[0, 10\)"),
        (lambda: Permutation(10).take(0, 5, 0), r"step \(0\)"),
    ],
)
def test_bad_input(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


def test_empty() -> None:
    assert Permutation(0).take(0, 0).size == 0 and len(Permutation(0)) == 0


def test_large_seeds_do_not_alias_other_epochs() -> None:
    # Joining words without their count would make (2**64 + 7, 0) == (7, 1) and the like.
    assert permutation_keys(2**32 + 7, 0) != permutation_keys(7, 1)
    assert permutation_keys(2**32, 0) != permutation_keys(0, 1)
    assert permutation_keys(2**64 + 7, 0) != permutation_keys(7, 1)
    assert permutation_keys(2**64, 0) != permutation_keys(0, 1)
    assert permutation_keys(0, 2**64) != permutation_keys(2**64, 0)
    a = Permutation(10, 1 + 2 * 2**32, 3).take(0, 10).tolist()
    b = Permutation(10, 1, 2 + 3 * 2**32).take(0, 10).tolist()
    assert a != b


@given(n=st.integers(1, 5000), seed=st.integers(0, 2**70), epoch=st.integers(0, 50))
@settings(max_examples=30, deadline=None)
def test_a_cached_permutation_is_the_permutation_and_cannot_be_changed(
    n: int, seed: int, epoch: int
) -> None:
    # One object per (n, seed, epoch), shared by every fetch of a pass (block_order): it
    # must answer as a fresh one does, and no caller may write into its tables.
    cached = cached_permutation(n, seed, epoch)
    assert cached is cached_permutation(n, seed, epoch)
    fresh = Permutation(n, seed, epoch)
    positions = np.arange(n)
    assert np.array_equal(cached[positions], fresh[positions])
    assert np.array_equal(cached.inverse(positions), fresh.inverse(positions))
    got = cached.take(0, n)
    got[:] = 0  # a copy: the cache is untouched
    assert np.array_equal(cached.take(0, n), fresh.take(0, n))
    for table in (cached._table, cached._table_inv):
        if table is not None:
            with pytest.raises(ValueError, match="read-only"):
                table[0] = 1
