"""Weighted and class-balanced strategies for :class:`~rankwise.data.FetchDataset` (scDataset's
``BlockWeightedSampling`` and ``ClassBalancedSampling``).

Each epoch draws ``total_size`` rows by weight (with replacement, or without it in rounds of
``sampling_size`` distinct rows), sorts the draws by row — so a block of the epoch is a short
run of nearby rows, one cheap read — and visits the draws in shuffled blocks of
``block_size``. Everything is a pure function of ``(n, seed, epoch)``: the draws come from
rankwise's own counter-based hash (never a numpy / torch RNG stream), so every rank and worker
computes the same epoch, whatever the world size, and a saved ``state_dict`` resumes it after an
upgrade. FetchDataset deals the epoch to ranks as it deals any strategy's, so every rank gets
the same number of batches.

>>> s = BlockWeightedSampling(block_size=2, weights=[0, 1, 1, 2], total_size=6)
>>> draws = s.draws(4, seed=0, epoch=0)
>>> len(draws), 0 in draws.tolist(), draws.tolist() == sorted(draws.tolist())
(6, False, True)
>>> sorted(s.order(4, np.arange(6), seed=0, epoch=0).tolist()) == draws.tolist()
True
"""

from __future__ import annotations

import warnings

import numpy as np
import numpy.typing as npt

from rankwise.data.permutation import absorb, mix
from rankwise.data.strategies import base_length, block_order, check_block_size, subset_indices
from rankwise.distributed.errors import RankwiseWarning
from rankwise.validation import check_int

__all__ = ["BlockWeightedSampling", "ClassBalancedSampling", "class_balance_weights", "uniforms"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

_DOMAIN = 0x72772D7765696768  # b"rw-weigh": keeps these draws apart from every other hash
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix_array(z: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    # SplitMix64's finaliser, vectorised (uint64 arithmetic wraps, as the hash needs).
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def uniforms(seed: int, epoch: int, stream: int, count: int) -> FloatArray:
    """``count`` floats in ``[0, 1)``, a pure function of ``(seed, epoch, stream, i)``.

    rankwise's own SplitMix64-style hash, so the values never change with numpy or torch.

    >>> u = uniforms(0, 0, 0, 4)
    >>> bool(((0 <= u) & (u < 1)).all()), bool((u == uniforms(0, 0, 0, 4)).all())
    (True, True)
    >>> bool((u != uniforms(0, 1, 0, 4)).all())
    True
    """
    state = absorb(absorb(absorb(_DOMAIN, check_int("seed", seed)), epoch), stream)
    k0, k1 = np.uint64(mix(state)), np.uint64(mix(state ^ 0x5BD1E995))
    z = _mix_array(np.arange(count, dtype=np.uint64) * _GAMMA + k0)
    z = _mix_array(z ^ k1)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def class_balance_weights(labels: npt.ArrayLike) -> FloatArray:
    """One weight per sample, ``1 / (samples of its class)``: every class weighs the same.

    >>> class_balance_weights([0, 0, 1, 2, 2, 2]).round(3).tolist()
    [0.5, 0.5, 1.0, 0.333, 0.333, 0.333]
    """
    arr = np.asarray(labels)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            f"labels must be a non-empty 1-D array with one class label per sample (got shape "
            f"{arr.shape}); pass e.g. adata.obs['cell_type'].to_numpy()."
        )
    _, inverse, counts = np.unique(arr, return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse].astype(np.float64)


class BlockWeightedSampling:
    """``total_size`` rows drawn by ``weights`` each epoch, visited in shuffled blocks.

    ``weights``: one per row of the source, or one per entry of ``indices`` (None: uniform);
    non-negative, normalised for you. ``total_size``: draws per epoch (default: the rows, or
    ``len(indices)``). ``replace=False`` draws in rounds of ``sampling_size`` distinct rows
    (each round is weighted sampling without replacement; rounds are independent). The draws
    are sorted by row and cut into blocks of ``block_size`` in a shuffled order; the rows of
    each fetch are shuffled again in memory.

    Memory: the epoch's sorted draws (``total_size`` ints), cached once per epoch per process,
    next to the weights themselves.

    >>> s = BlockWeightedSampling(block_size=4, weights=[1, 0, 3], total_size=8)
    >>> s.epoch_length(3), sorted(set(s.draws(3, seed=0, epoch=0).tolist()))
    (8, [0, 2])
    """

    shuffle_fetch = True

    def __init__(
        self,
        block_size: int = 8,
        indices: npt.ArrayLike | None = None,
        weights: npt.ArrayLike | None = None,
        total_size: int | None = None,
        replace: bool = True,
        sampling_size: int | None = None,
    ) -> None:
        self.block_size = check_block_size(block_size)
        self.indices = subset_indices(indices)
        self.weights = None if weights is None else _check_weights(weights)
        self.total_size = None if total_size is None else check_int("total_size", total_size)
        self.replace = bool(replace)
        if not self.replace and sampling_size is None:
            raise ValueError(
                "replace=False needs sampling_size (the distinct rows drawn per round); pass "
                "e.g. sampling_size=len(weights), or use replace=True."
            )
        if self.replace and sampling_size is not None:
            warnings.warn(
                f"sampling_size ({sampling_size}) is ignored with replace=True: every draw is "
                "independent; drop it, or pass replace=False to draw rounds of distinct rows.",
                RankwiseWarning,
                stacklevel=2,
            )
        self.sampling_size = (
            None if sampling_size is None else check_int("sampling_size", sampling_size, minimum=1)
        )
        self._cache: tuple[tuple[int, int, int], IntArray] | None = None

    def epoch_length(self, n: int) -> int:
        m = base_length(n, self.indices)
        total = m if self.total_size is None else self.total_size
        weights = self._weights_for(n)
        if total and not m:
            raise ValueError(f"total_size ({total}) draws need rows to draw from, but there are 0.")
        if not self.replace and total:
            assert self.sampling_size is not None  # checked in __init__
            positive = m if weights is None else int(np.count_nonzero(weights))
            if positive < min(self.sampling_size, total):
                raise ValueError(
                    f"replace=False draws rounds of {min(self.sampling_size, total)} distinct "
                    f"rows, but only {positive} rows have a positive weight; lower "
                    "sampling_size or use replace=True."
                )
        return total

    def _weights_for(self, n: int) -> FloatArray | None:
        """The weights of the rows that can be drawn (``indices`` order), or None: uniform."""
        if self.weights is None:
            return None
        m, w = base_length(n, self.indices), self.weights
        if len(w) != m:
            if self.indices is None or len(w) != n:
                sizes = f"the source's {n} rows" + (
                    "" if self.indices is None else f" or the {m} indices"
                )
                raise ValueError(
                    f"weights has {len(w)} entries but must have one per row: {sizes}; pass "
                    "one weight per row."
                )
            w = w[self.indices]
        if m and not w.sum() > 0:
            raise ValueError(
                "the weights of the rows that can be drawn sum to 0; give at least one of them "
                "a positive weight."
            )
        return w

    def draws(self, n: int, seed: int, epoch: int) -> IntArray:
        """The rows drawn in ``epoch``, sorted: a pure function of ``(n, seed, epoch)``."""
        key = (n, seed, epoch)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        total, weights = self.epoch_length(n), self._weights_for(n)
        m = base_length(n, self.indices)
        if self.replace:
            picked = _with_replacement(weights, m, total, seed, epoch)
        else:
            assert self.sampling_size is not None
            picked = _in_rounds(weights, m, total, self.sampling_size, seed, epoch)
        rows = picked if self.indices is None else self.indices[picked]
        rows = np.sort(rows).astype(np.int64)
        self._cache = (key, rows)
        return rows

    def order(self, n: int, positions: IntArray, *, seed: int, epoch: int) -> IntArray:
        draws = self.draws(n, seed, epoch)
        return draws[block_order(len(draws), self.block_size, positions, seed, epoch)]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(block_size={self.block_size}, total_size={self.total_size}, "
            f"replace={self.replace}, sampling_size={self.sampling_size})"
        )


class ClassBalancedSampling(BlockWeightedSampling):
    """:class:`BlockWeightedSampling` with weights ``1 / class size``: each class is drawn
    equally often on average, whatever its share of the data.

    ``labels``: one per row of the source (global balance: a subset given by ``indices`` keeps
    the whole data set's class weights) or one per entry of ``indices`` (balance within the
    subset).

    >>> s = ClassBalancedSampling([0] * 90 + [1] * 10, total_size=10_000)
    >>> rows = s.draws(100, seed=0, epoch=0)
    >>> 0.47 < float(np.mean(rows >= 90)) < 0.53      # class 1: 10% of rows, half the draws
    True
    """

    def __init__(
        self,
        labels: npt.ArrayLike,
        block_size: int = 8,
        indices: npt.ArrayLike | None = None,
        total_size: int | None = None,
        replace: bool = True,
        sampling_size: int | None = None,
    ) -> None:
        self.labels = np.asarray(labels)
        weights = class_balance_weights(self.labels)
        if indices is not None and len(self.labels) < len(np.asarray(indices)):
            raise ValueError(
                f"labels has {len(self.labels)} entries, fewer than the "
                f"{len(np.asarray(indices))} indices; pass one label per index (balance within "
                "the subset) or one per row of the source (global balance)."
            )
        super().__init__(block_size, indices, weights, total_size, replace, sampling_size)

    def _weights_for(self, n: int) -> FloatArray | None:
        # The weights are derived from labels: a length mismatch is the labels' to report.
        m = base_length(n, self.indices)
        if len(self.labels) not in (n, m):
            sizes = f"the source's {n} rows" + (
                "" if self.indices is None else f" or the {m} indices"
            )
            raise ValueError(
                f"labels has {len(self.labels)} entries but must have one per row: {sizes}; "
                "pass one label per row of the source (or one per index, to balance within "
                "the subset)."
            )
        return super()._weights_for(n)


def _check_weights(weights: npt.ArrayLike) -> FloatArray:
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1:
        raise ValueError(f"weights must be 1-D, one per row (got shape {w.shape}).")
    bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
    if bad.size:
        raise ValueError(
            f"weights must be finite and >= 0, but weights[{int(bad[0])}] is "
            f"{float(w[bad[0]])} ({bad.size} such entries); pass one finite, non-negative "
            "weight per row."
        )
    if w.size and not w.sum() > 0:
        raise ValueError("weights sum to 0; give at least one row a positive weight.")
    return w


def _with_replacement(
    weights: FloatArray | None, m: int, total: int, seed: int, epoch: int
) -> IntArray:
    """``total`` independent draws from ``[0, m)`` by inverting the weights' CDF."""
    u = uniforms(seed, epoch, 0, total)
    if weights is None:
        return np.minimum((u * m).astype(np.int64), m - 1)
    cdf = np.cumsum(weights)
    picked = np.searchsorted(cdf, u * cdf[-1], side="right")
    # u * total can round up to the total itself; the last positive row takes that draw.
    return np.minimum(picked, int(np.flatnonzero(weights)[-1])).astype(np.int64)


def _in_rounds(
    weights: FloatArray | None, m: int, total: int, size: int, seed: int, epoch: int
) -> IntArray:
    """Rounds of ``size`` distinct rows: in each, the rows with the smallest exponential keys
    ``E_i / w_i`` (Efraimidis-Spirakis), which is weighted sampling without replacement."""
    out, done, round_ = [], 0, 0
    while done < total:
        k = min(size, total - done)
        keys = -np.log1p(-uniforms(seed, epoch, round_ + 1, m))  # Exp(1), finite
        if weights is not None:
            with np.errstate(divide="ignore"):
                keys = np.where(weights > 0, keys / weights, np.inf)
        out.append(np.argpartition(keys, k - 1)[:k] if k < m else np.arange(m))
        done, round_ = done + k, round_ + 1
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, dtype=np.int64)
