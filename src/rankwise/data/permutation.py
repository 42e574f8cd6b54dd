"""A seeded permutation of ``[0, N)`` computed on the fly, in O(1) memory.

:class:`Permutation` maps a position ``p`` to ``perm[p]`` without ever building ``perm``: a
keyed Feistel network is a bijection on ``[0, 2**k)`` (``2**k`` the next power of two >= N),
and *cycle walking* (apply it again while the value is >= N) restricts it to a bijection on
``[0, N)``. Because ``2**k < 2 * N`` fewer than two rounds of walking are needed on average.
Everything is vectorised with numpy over arrays of positions, so a sampler can compute the
indices of one chunk at a time.

The round keys are rankwise's own: a SplitMix64-style integer hash of ``(seed, epoch, round)``
written here, never a library RNG stream (numpy promises ``Generator`` streams only on the
same build), so a checkpoint resumes the same order after numpy or torch is upgraded. Each of
seed and epoch is absorbed with its length in 64-bit words, so ``(seed=0, epoch=1)`` and
``(seed=1, epoch=0)`` -- or ``(2**64 + 7, 0)`` and ``(7, 1)`` -- give unrelated orders (unlike
torch's ``seed + epoch``).

The same network serves every N, also tiny ones: the domain has at least ``2**MIN_BITS``
values and there are ``ROUNDS`` rounds, enough that every order of 4 items occurs with even
odds and the mean number of fixed points is 1, as for a uniform shuffle. :data:`ORDER_VERSION`
names this algorithm; any change to the orders it gives must bump it (golden values in the
tests catch one).

Module state: only :func:`cached_permutation`'s ``functools.lru_cache`` (the last 16
permutations asked for, their tables read-only): a block order is asked for once per fetch
with the same ``(n, seed, epoch)``, and a permutation is a pure function of them, so one
object per process serves them all.

>>> p = Permutation(10, seed=0, epoch=0)
>>> sorted(p.take(0, 10).tolist()) == list(range(10))   # a true permutation of 0..9
True
>>> int(p.inverse(p[3])) == 3
True
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from rankwise.validation import check_epoch, check_int

# check_epoch / check_int live in rankwise.validation; re-exported for older imports.
__all__ = [
    "DEFAULT_CHUNK",
    "ORDER_VERSION",
    "Permutation",
    "cached_permutation",
    "check_epoch",
    "check_int",
    "permutation_keys",
]

#: The algorithm that maps ``(N, seed, epoch)`` to an order. Saved in every ``state_dict``;
#: bump it whenever an order changes, so an old checkpoint is refused instead of resumed on a
#: different order.
ORDER_VERSION = 1

#: Positions computed per numpy call when iterating: big enough to amortise Python overhead,
#: small enough (a few MiB of temporaries) that memory stays flat whatever N is.
DEFAULT_CHUNK = 1 << 16

# Six rounds, on a domain of at least 2**6 values: with four rounds or 1-bit halves, small N
# showed a measurable bias (N=5: some orders 3x likelier than others; 1.04 fixed points per
# order instead of 1 up to N=100). Six rounds on 3-bit halves are uniform within noise.
ROUNDS = 6
MIN_BITS = 6
TABLE_BITS = 12  # domains up to 4096 values (n <= 4096) are tabulated; see Permutation

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment (the golden ratio in 64 bits)
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # SplitMix64's finaliser
_DOMAIN = 0x72772D6F72646572  # b"rw-order": keeps these keys apart from augment's hashes

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xD6E8FEB86659FD93)
_S32 = np.uint64(32)

IntArray = npt.NDArray[np.int64]


def mix(z: int) -> int:
    # SplitMix64's finaliser: a bijection on 64-bit words with full avalanche.
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK
    return z ^ (z >> 31)


def absorb(state: int, value: int) -> int:
    # The word count first, then each 64-bit word: no two (seed, epoch) pairs share an input.
    words = [(value >> shift) & _MASK for shift in range(0, max(value.bit_length(), 1), 64)]
    state = mix(((state ^ len(words)) + _GAMMA) & _MASK)
    for word in words:
        state = mix(((state ^ word) + _GAMMA) & _MASK)
    return state


def permutation_keys(seed: int, epoch: int, rounds: int = ROUNDS) -> tuple[int, ...]:
    """The Feistel round keys for ``(seed, epoch)``: a hash of the pair, never ``seed + epoch``.

    Pure integer arithmetic written in this module, so the keys (and the order) do not change
    with the numpy or torch version.

    >>> permutation_keys(0, 1) != permutation_keys(1, 0)
    True
    >>> hex(permutation_keys(0, 0)[0])
    '0xaf2d7bcab9ebd5de'
    """
    seed = check_int("seed", seed)
    epoch = check_int("epoch", epoch)
    state = absorb(absorb(_DOMAIN, seed), epoch)
    return tuple(mix((state + (i + 1) * _GAMMA) & _MASK) for i in range(rounds))


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
        self.epoch = check_epoch(epoch)
        # Domain 2**bits >= n, at least 2**MIN_BITS so each Feistel half has a few bits to mix.
        self._bits = max(MIN_BITS, (self.n - 1).bit_length())
        self._keys = [np.uint64(k) for k in permutation_keys(self.seed, self.epoch)]
        # Small domains: the same order, walked once through a table of the network (at most
        # 2**TABLE_BITS values, so still O(1) memory) instead of up to 2**MIN_BITS / n passes
        # of the network per call.
        self._table: IntArray | None = None
        self._table_inv: IntArray | None = None
        if self._bits <= TABLE_BITS:
            network = self._forward(np.arange(1 << self._bits, dtype=np.uint64))
            self._table = self._walk(np.arange(self.n, dtype=np.uint64), network.__getitem__)
            self._table_inv = np.empty_like(self._table)
            self._table_inv[self._table] = np.arange(self.n, dtype=np.int64)
            self._table.setflags(write=False)  # shared by cached_permutation's callers
            self._table_inv.setflags(write=False)

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
        # mixed, so those are the round output. In place where numpy allows: two temporaries
        # per round instead of five (the hot loop of every sampler pass).
        h = right ^ key
        h *= _M1
        tmp = h >> _S32
        h ^= tmp
        h *= _M2
        np.right_shift(h, _S32, out=tmp)
        h ^= tmp
        np.right_shift(h, np.uint64(64 - width), out=h)
        return h

    def _forward(self, x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        wl, wr = self._widths()
        left, right = x >> np.uint64(wr), x & np.uint64((1 << wr) - 1)
        for key in self._keys:
            # (L, R) -> (R, L ^ F(R)): invertible whatever F is; the halves swap widths.
            f = self._round(right, key, wl)
            f ^= left
            left, right = right, f
            wl, wr = wr, wl
        return (left << np.uint64(wr)) | right

    def _backward(self, y: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        wl, wr = self._widths()
        if len(self._keys) % 2:
            wl, wr = wr, wl
        left, right = y >> np.uint64(wr), y & np.uint64((1 << wr) - 1)
        for key in reversed(self._keys):
            # Undo (L, R) -> (R, L ^ F(R)): the previous R is the current L.
            f = self._round(left, key, wr)
            f ^= right
            left, right = f, left
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
                f"{arr.min().item()!r} to {arr.max().item()!r}."
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


@functools.lru_cache(maxsize=16)
def cached_permutation(n: int, seed: int = 0, epoch: int = 0) -> Permutation:
    """``Permutation(n, seed, epoch)``, made once per process for the same arguments (the last
    16 kept). A block order is asked for once per fetch, always of the same ``(n, seed,
    epoch)`` within a pass; a tabulated permutation costs a pass of the network over up to
    4,096 values to make, and answers by indexing (a copy), so one object serves every fetch.
    """
    return Permutation(n, seed, epoch)
