"""A seeded permutation of ``[0, N)`` computed on the fly, in O(1) memory.

:class:`Permutation` maps a position ``p`` to ``perm[p]`` without ever building ``perm``: a
keyed Feistel network is a bijection on ``[0, 2**k)`` (``2**k`` the next power of two >= N),
and *cycle walking* (apply it again while the value is >= N) restricts it to a bijection on
``[0, N)``. Because ``2**k < 2 * N`` fewer than two rounds of walking are needed on average.
Everything is vectorised with numpy over arrays of positions, so a sampler can compute the
indices of one chunk at a time.

The round keys come from ``numpy.random.SeedSequence(seed, spawn_key=(epoch,))``: a proper
hash of the pair, so ``(seed=0, epoch=1)`` and ``(seed=1, epoch=0)`` give unrelated orders
(unlike torch's ``seed + epoch``). The epoch goes in the spawn key, not next to the seed in the
entropy list: ``SeedSequence([seed, epoch])`` joins 32-bit words without a length, so
``(2**32 + 7, 0)`` and ``(7, 1)`` would collide.

>>> p = Permutation(10, seed=0, epoch=0)
>>> sorted(p.take(0, 10).tolist()) == list(range(10))   # a true permutation of 0..9
True
>>> int(p.inverse(p[3])) == 3
True
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

__all__ = ["DEFAULT_CHUNK", "SMALL_N", "Permutation", "permutation_keys"]

#: Positions computed per numpy call when iterating: big enough to amortise Python overhead,
#: small enough (a few MiB of temporaries) that memory stays flat whatever N is.
DEFAULT_CHUNK = 1 << 16
# Epochs are shared with DataLoader workers through int64 tensors (see check_epoch).
MAX_EPOCH = 2**63 - 1

#: Up to this n the permutation is a stored table (exactly uniform; 32 KiB at most).
SMALL_N = 4096

_ROUNDS = 4  # Luby-Rackoff: four rounds of a pseudo-random function give a strong PRP.
_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xD6E8FEB86659FD93)
_S32 = np.uint64(32)

IntArray = npt.NDArray[np.int64]


def check_int(name: str, value: object, *, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` as a Python int, or a ValueError naming it, the rule and the fix.

    >>> check_int("sample_id", 3)
    3
    >>> check_int("sample_id", -1)
    Traceback (most recent call last):
    ...
    ValueError: sample_id (-1) must be >= 0; pass a non-negative integer.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(
            f"{name} ({value!r}) must be an integer, got {type(value).__name__}; "
            f"pass int({name}) if it holds a whole number."
        )
    value = int(value)
    if value < minimum:
        fix = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
        raise ValueError(f"{name} ({value}) must be >= {minimum}; pass {fix}.")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} ({value}) must be <= {maximum}; reduce it modulo 2**64.")
    return value


def check_epoch(value: object, name: str = "epoch") -> int:
    """An epoch that fits the int64 tensors through which samplers and datasets share it
    with their DataLoader workers (``check_int`` with the bound ``MAX_EPOCH``)."""
    return check_int(name, value, maximum=MAX_EPOCH)


def permutation_keys(seed: int, epoch: int, rounds: int = _ROUNDS) -> tuple[int, ...]:
    """The Feistel round keys for ``(seed, epoch)``: a hash of the pair, never ``seed + epoch``.

    >>> permutation_keys(0, 1) != permutation_keys(1, 0)
    True
    """
    seed = check_int("seed", seed)
    epoch = check_int("epoch", epoch)
    state = np.random.SeedSequence(seed, spawn_key=(epoch,)).generate_state(rounds, dtype=np.uint64)
    return tuple(int(k) for k in state)


class Permutation:
    """The bijection ``position -> index`` on ``[0, n)`` for one ``(seed, epoch)``.

    ``perm[p]`` / ``perm.take(start, stop, step)`` give indices for positions, ``inverse``
    gives positions for indices. Memory is O(1) in ``n``; work is O(number of positions asked).

    >>> perm = Permutation(5, seed=42, epoch=3)
    >>> order = perm.take(0, 5)
    >>> sorted(order.tolist())
    [0, 1, 2, 3, 4]
    >>> perm.take(0, 5, 2).tolist() == order[0:5:2].tolist()   # strided positions, no list
    True
    """

    def __init__(self, n: int, seed: int = 0, epoch: int = 0) -> None:
        self.n = check_int("n", n)
        if self.n >= 1 << 62:
            raise ValueError(f"n ({self.n}) must be < 2**62.")
        self.seed = check_int("seed", seed)
        self.epoch = check_int("epoch", epoch)
        # Domain 2**bits >= n, at least 2 bits so each Feistel half has one bit.
        self._bits = max(2, (self.n - 1).bit_length())
        self._keys = [np.uint64(k) for k in permutation_keys(self.seed, self.epoch)]
        # A Feistel network on a tiny domain reaches only a skewed subset of the n! orders, so
        # small n uses an exactly uniform table instead: at most SMALL_N ints, still O(1).
        self._table: IntArray | None = None
        self._table_inv: IntArray | None = None
        if self.n <= SMALL_N:
            rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(self.epoch,)))
            self._table = rng.permutation(self.n).astype(np.int64)
            self._table_inv = np.argsort(self._table).astype(np.int64)

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"Permutation(n={self.n}, seed={self.seed}, epoch={self.epoch})"

    # -- the Feistel network on [0, 2**bits) ---------------------------------------------------

    def _widths(self) -> tuple[int, int]:
        low = self._bits // 2
        return self._bits - low, low  # (width of the left half, width of the right half)

    @staticmethod
    def _round(right: npt.NDArray[np.uint64], key: np.uint64, width: int) -> npt.NDArray[np.uint64]:
        # A 64-bit multiply-xorshift hash of (right, key); its top `width` bits are the best
        # mixed, so those are the round output.
        h = right ^ key
        h *= _M1
        h ^= h >> _S32
        h *= _M2
        h ^= h >> _S32
        return h >> np.uint64(64 - width)

    def _forward(self, x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        wl, wr = self._widths()
        left, right = x >> np.uint64(wr), x & np.uint64((1 << wr) - 1)
        for key in self._keys:
            # (L, R) -> (R, L ^ F(R)): invertible whatever F is; the halves swap widths.
            left, right = right, left ^ self._round(right, key, wl)
            wl, wr = wr, wl
        return (left << np.uint64(wr)) | right

    def _backward(self, y: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        wl, wr = self._widths()
        if len(self._keys) % 2:
            wl, wr = wr, wl
        left, right = y >> np.uint64(wr), y & np.uint64((1 << wr) - 1)
        for key in reversed(self._keys):
            # Undo (L, R) -> (R, L ^ F(R)): the previous R is the current L.
            left, right = right ^ self._round(left, key, wr), left
            wl, wr = wr, wl
        return (left << np.uint64(wr)) | right

    def _walk(self, values: npt.NDArray[np.uint64], step: object) -> IntArray:
        shape = values.shape
        out = step(values.reshape(-1))  # type: ignore[operator]
        todo = np.flatnonzero(out >= np.uint64(self.n))
        while todo.size:  # cycle walking: stays inside [0, n) and keeps it a bijection
            out[todo] = step(out[todo])  # type: ignore[operator]
            todo = todo[out[todo] >= np.uint64(self.n)]
        return out.astype(np.int64).reshape(shape)

    # -- public --------------------------------------------------------------------------------

    def _positions(self, positions: npt.ArrayLike) -> npt.NDArray[np.uint64]:
        arr = np.asarray(positions)
        if arr.size and (
            not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0 or arr.max() >= self.n
        ):
            raise ValueError(
                f"positions must be integers in [0, {self.n}); got values from "
                f"{arr.min()!r} to {arr.max()!r}."
            )
        return arr.astype(np.uint64)

    def __getitem__(self, positions: npt.ArrayLike) -> IntArray:
        """``perm[positions]`` for an int or an integer array of positions (same shape)."""
        if self._table is not None:
            return self._table[self._positions(positions).astype(np.int64)]
        return self._walk(self._positions(positions), self._forward)

    def inverse(self, indices: npt.ArrayLike) -> IntArray:
        """Positions at which ``indices`` appear: ``perm.inverse(perm[p]) == p``."""
        if self._table_inv is not None:
            return self._table_inv[self._positions(indices).astype(np.int64)]
        return self._walk(self._positions(indices), self._backward)

    def take(self, start: int, stop: int, step: int = 1) -> IntArray:
        """``perm[start:stop:step]`` as an int64 array (``step`` > 0)."""
        if step < 1:
            raise ValueError(f"step ({step}) must be >= 1.")
        return self[np.arange(start, min(stop, self.n), step, dtype=np.int64)]

    def chunks(
        self, start: int, stop: int, step: int = 1, chunk: int = DEFAULT_CHUNK
    ) -> Iterator[IntArray]:
        """``perm[start:stop:step]`` in arrays of at most ``chunk`` values: flat memory."""
        span = chunk * step
        for lo in range(start, min(stop, self.n), span):
            yield self.take(lo, min(lo + span, stop), step)
