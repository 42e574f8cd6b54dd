"""The O(1)-memory permutation: a true bijection, keyed by (seed, epoch), well mixed."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwise.data import Permutation, permutation_keys
from rankwise.data.permutation import SMALL_N

SIZES = [1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 64, 127, 1000, 4096, 4097, 8191, 8192, 65537, 100_003]


@pytest.mark.parametrize("n", SIZES)
def test_is_a_permutation_and_inverse(n: int) -> None:
    perm = Permutation(n, seed=7, epoch=3)
    order = perm.take(0, n)
    assert np.array_equal(np.sort(order), np.arange(n))
    assert np.array_equal(perm.inverse(order), np.arange(n))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20_000), st.integers(0, 2**32), st.integers(0, 1000))
def test_bijection_property(n: int, seed: int, epoch: int) -> None:
    order = Permutation(n, seed, epoch).take(0, n)
    assert np.array_equal(np.sort(order), np.arange(n))


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
    assert len(set(small)) > 30  # small n (table path) is keyed too


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
    counts: dict[tuple[int, ...], int] = {}
    for epoch in range(2400):
        key = tuple(Permutation(4, seed=3, epoch=epoch).take(0, 4).tolist())
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 24 and min(counts.values()) > 60 and max(counts.values()) < 140


def test_large_n_starts_at_once_in_small_memory() -> None:
    n = 10**12
    tracemalloc.start()
    perm = Permutation(n, seed=1, epoch=1)
    values = perm.take(n - 1000, n)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2_000_000 and perm._table is None
    assert values.min() >= 0 and values.max() < n and len(set(values.tolist())) == 1000
    assert np.array_equal(perm.inverse(values), np.arange(n - 1000, n))
    assert n > SMALL_N


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
    # SeedSequence([seed, epoch]) would join 32-bit words: (2**32 + 7, 0) == (7, 1).
    assert permutation_keys(2**32 + 7, 0) != permutation_keys(7, 1)
    assert permutation_keys(2**32, 0) != permutation_keys(0, 1)
    a = Permutation(10, 1 + 2 * 2**32, 3).take(0, 10).tolist()
    b = Permutation(10, 1, 2 + 3 * 2**32).take(0, 10).tolist()
    assert a != b
