"""Seeds for deterministic augmentation: the DPA rank-aware SHA-256 seeds and a counter hash.

Two families, for the two modes of :mod:`rankwise.augment`:

- :class:`RankAwareSeedGenerator` is the DPA guide's API: a SHA-256 hex digest of
  ``(base_seed, rank, sample_id)`` re-hashed ``augmentation_depth`` times (:func:`dpa_digest`).
  One call per sample.
- :func:`counter_hash` is the training path: a SplitMix64-style 64-bit mix of
  ``(base_seed, epoch, sample_id, stream)`` in numpy ``uint64`` arithmetic, vectorised over any
  array of sample ids. It is a pure function: no generator state, so the same sample gets the
  same bits in any batch, order, process or world size.

Neither touches the global ``random`` / numpy / torch generators.

Module state: only ``functools.lru_cache`` memos of pure functions (the round suffixes of a
depth, the hash head of a ``(seed, epoch)``): they change no answer, only its cost.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
from typing import Any

import numpy as np
import numpy.typing as npt

from rankwise.validation import check_int, check_rank

U64 = npt.NDArray[np.uint64]

# SplitMix64 constants (Steele, Lea & Flood 2014; Stafford's "Mix13" finaliser). The mix is a
# bijection on 64-bit words, so absorbing distinct sample ids under one key never collides.
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
MIX_MUL1 = 0xBF58476D1CE4E5B9
MIX_MUL2 = 0x94D049BB133111EB
# Separates rankwise's keys from other SplitMix64 users seeded with small integers.
_DOMAIN = 0x72616E6B77697365  # b"rankwise"

MAX_U64 = (1 << 64) - 1


# --------------------------------------------------------------------------- DPA (per sample)


class RankAwareSeedGenerator:
    """DPA's rank-aware seeds: a 64-character SHA-256 hex digest per ``(sample_id, rank)``.

    The digest is :func:`dpa_digest`'s, unique per ``(base_seed, sample_id, rank, depth)``: the
    same sample gets different seeds on different ranks, which is what DPA wants and why this
    mode depends on the world's layout.

    >>> gen = RankAwareSeedGenerator(base_seed=42, world_size=8)
    >>> seed = gen.generate_seed(sample_id=100, rank=3)
    >>> len(seed), seed == gen.generate_seed(100, 3), seed == gen.generate_seed(100, 2)
    (64, True, False)
    """

    def __init__(self, base_seed: int = 0, world_size: int = 1) -> None:
        self.base_seed = check_int("base_seed", base_seed)
        self.world_size = check_int("world_size", world_size, minimum=1)

    def generate_seed(self, sample_id: int, rank: int, augmentation_depth: int = 10) -> str:
        """The hex seed of ``sample_id`` on ``rank`` after ``augmentation_depth`` rounds."""
        sample_id = check_int("sample_id", sample_id)
        rank, _ = check_rank(rank, self.world_size)
        depth = check_int("augmentation_depth", augmentation_depth, minimum=1)
        return dpa_digest(self.base_seed, rank, sample_id, depth).hex()

    def __repr__(self) -> str:
        return f"RankAwareSeedGenerator(base_seed={self.base_seed}, world_size={self.world_size})"


def dpa_digest(base_seed: int, rank: int, sample_id: int, depth: int) -> bytes:
    """The 32-byte SHA-256 chain behind DPA's seeds (arguments already checked).

    Round 1 hashes the key ``b"{base_seed}:{rank}:{sample_id}"``; round ``k + 1`` hashes the
    previous round's 32 raw bytes followed by ``b":{k}"``; ``depth`` rounds in all. Raw bytes,
    not hex text, are what each round hashes: that halves the input and skips a hex encoding
    per round, which kept the per-sample DPA call slower than one SHA-256 plus ``random``.

    >>> d1 = hashlib.sha256(b"7:2:5").digest()
    >>> dpa_digest(7, 2, 5, 2) == hashlib.sha256(d1 + b":1").digest()
    True
    """
    digest = _sha256(b"%d:%d:%d" % (base_seed, rank, sample_id)).digest()
    for suffix in _round_suffixes(depth):
        digest = _sha256(digest + suffix).digest()
    return digest


def _fastest_sha256() -> Any:
    # CPython's own SHA-256 (``_sha2`` from 3.12, ``_sha256`` before) hashes one short block
    # about 15% faster than OpenSSL's, whose per-object set-up dominates at 34 bytes; the
    # digests are the same. Builds without it fall back to hashlib's.
    for module in ("_sha2", "_sha256"):
        try:
            return importlib.import_module(module).sha256
        except (ImportError, AttributeError):
            continue
    return hashlib.sha256


_sha256 = _fastest_sha256()


@functools.lru_cache(maxsize=64)
def _round_suffixes(depth: int) -> tuple[bytes, ...]:
    # The round number keeps a digest that happens to repeat from cycling; built once per depth.
    return tuple(b":%d" % round_no for round_no in range(1, depth))


# --------------------------------------------------------------------- counter hash (vectorised)


def mix64(x: U64) -> U64:
    """SplitMix64's finaliser on a ``uint64`` array (wrapping arithmetic; a bijection).

    >>> int(mix64(np.array([1], dtype=np.uint64))[0])
    6238072747940578789
    """
    with np.errstate(over="ignore"):  # scalars warn on wrap-around; arrays never do
        z = np.asarray(x, dtype=np.uint64)
        z = (z ^ (z >> _S30)) * _M1
        z = (z ^ (z >> _S27)) * _M2
        return z ^ (z >> _S31)


_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_M1, _M2 = np.uint64(MIX_MUL1), np.uint64(MIX_MUL2)


def as_sample_ids(sample_ids: Any) -> U64:
    """``sample_ids`` as a ``uint64`` array of the same shape, after checking they are ids.

    >>> as_sample_ids([3, 1, 2]).tolist()
    [3, 1, 2]
    """
    ids = np.asarray(sample_ids)
    if ids.dtype == np.bool_ or not (
        np.issubdtype(ids.dtype, np.integer) or (ids.size == 0 and ids.dtype == np.float64)
    ):
        raise ValueError(
            f"sample_ids must be integers, got dtype {ids.dtype}; "
            "pass np.asarray(ids, dtype=np.int64)."
        )
    if np.issubdtype(ids.dtype, np.signedinteger) and ids.size and ids.min() < 0:
        bad = int(ids[ids < 0].flat[0])
        raise ValueError(f"sample_id ({bad}) must be >= 0; sample ids are dataset indices.")
    return ids.astype(np.uint64)


def sample_keys(sample_ids: U64, *, base_seed: int, epoch: int) -> U64:
    """One 64-bit key per sample, a function of ``(base_seed, epoch, sample_id)`` only.

    Each input is absorbed through the bijective mix, so for a fixed ``(base_seed, epoch)``
    distinct sample ids get distinct keys, and ``(seed 0, epoch 1)`` has nothing to do with
    ``(seed 1, epoch 0)`` (unlike ``seed + epoch``).
    """
    seed = check_int("base_seed", base_seed, maximum=MAX_U64)
    epoch = check_int("epoch", epoch, maximum=MAX_U64)
    return mix64(sample_ids.astype(np.uint64) ^ _head(seed, epoch))


@functools.lru_cache(maxsize=256)
def _head(seed: int, epoch: int) -> np.uint64:
    # Per (seed, epoch), not per call: a training loop asks for the same pair many times.
    head = mix64(np.array([seed ^ _DOMAIN], dtype=np.uint64))
    return mix64(head ^ np.uint64(epoch))[0]


def stream_offsets(streams: int) -> U64:
    """``(j + 1)·γ`` for ``j < streams``: added to a key, word ``j`` of its SplitMix64 sequence."""
    return np.array([((j + 1) * GOLDEN_GAMMA) & MAX_U64 for j in range(streams)], dtype=np.uint64)


def stream_bits(keys: U64, stream: int) -> U64:
    """Word number ``stream`` of each key's SplitMix64 sequence: ``mix64(key + (stream+1)·γ)``."""
    offset = np.uint64(((stream + 1) * GOLDEN_GAMMA) & MAX_U64)
    with np.errstate(over="ignore"):
        return mix64(keys + offset)


def to_unit(bits: U64) -> npt.NDArray[np.float64]:
    """The top 53 bits of each word as a float in ``[0, 1)`` (every double there equally likely)."""
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def counter_hash(sample_ids: Any, *, base_seed: int = 0, epoch: int = 0, stream: int = 0) -> U64:
    """64 pseudo-random bits per sample id, keyed by ``(base_seed, epoch, sample_id, stream)``.

    Pure and vectorised: ``counter_hash([5, 7])[1] == counter_hash([7])[0]``.

    >>> a = counter_hash(np.arange(4), base_seed=1, epoch=2)
    >>> b = counter_hash(np.array([3, 2]), base_seed=1, epoch=2)
    >>> bool(a[3] == b[0] and a[2] == b[1])
    True
    """
    keys = sample_keys(as_sample_ids(sample_ids), base_seed=base_seed, epoch=epoch)
    return stream_bits(keys, check_int("stream", stream))
