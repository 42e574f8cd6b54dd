"""``FetchDataset``: batches from an on-disk source, read in large sorted fetches (scDataset).

Random single-row reads of an HDF5 / backed AnnData file are slow; reading a few thousand
sorted rows at once is fast. So each *fetch* takes ``batch_size * fetch_factor`` consecutive
positions of the strategy's epoch order, reads their rows in one sorted call, shuffles them in
memory (when the strategy shuffles) and cuts them into batches.

Who reads what (pure maths in :func:`rank_fetches`): the epoch order (length L) is padded by
wrapping to ``M * R`` positions, ``M = ceil(L / R)`` rows per rank (``drop_last``: M is
``floor(L / R)`` rounded down to whole batches, the rest dropped). Fetches are dealt to ranks
round-robin (rank r reads fetches r, r+R, ...; with ``batch_size=1, fetch_factor=1`` that is
the guide's index round-robin), and the last round is cut into R equal pieces so every rank
gets exactly M rows — hence the same number of batches, which DDP needs. Inside a rank,
fetch i goes to DataLoader worker ``i % num_workers``::

    L=10 rows, R=2, batch_size=2, fetch_factor=2 (F=4): M=5 rows per rank
    rank 0: fetch 0 = positions 0-3, then last piece 8   -> batches [.. ..] [.. ..] [..]
    rank 1: fetch 1 = positions 4-7, then last piece 9   -> 3 batches as well

The epoch lives in shared memory created by the main process, so ``set_epoch`` reaches
DataLoader workers — persistent or not — on their next ``iter``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import IterableDataset, get_worker_info

from rankwise.data.partition import resolve_world
from rankwise.data.permutation import check_epoch, check_int
from rankwise.data.strategies import Strategy

__all__ = ["Fetch", "FetchDataset", "default_fetch", "rank_fetches", "rows_per_rank"]

IntArray = npt.NDArray[np.int64]


class Fetch(NamedTuple):
    """One sorted read: positions ``[start, stop)`` of the (padded) epoch order."""

    fetch_id: int  # global id, the same whatever worker reads it (seeds the in-memory shuffle)
    start: int
    stop: int


def rows_per_rank(length: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """Rows each rank reads in an epoch of ``length`` positions.

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
        Fetch(
            j * world_size + rank,
            (j * world_size + rank) * size,
            (j * world_size + rank + 1) * size,
        )
        for j in range(rounds)
    ]
    if rest:
        base = rounds * world_size * size
        out.append(Fetch(rounds * world_size + rank, base + rank * rest, base + (rank + 1) * rest))
    return out


def default_fetch(source: Any, indices: IntArray) -> Any:
    """Read rows ``indices`` (sorted, unique) of ``source`` in one go.

    h5py datasets are read one slice per run of consecutive rows (far faster than h5py's
    point selection); a backed AnnData view is loaded with ``to_memory()``; anything else is
    ``source[indices]``.
    """
    if type(source).__module__.startswith("h5py"):
        return _read_runs(source, indices)
    data = source[indices]
    if getattr(data, "is_view", False) and callable(getattr(data, "to_memory", None)):
        data = data.to_memory()  # AnnData: one read now, not one per batch later
    return data


def _probe_default_fetch(source: Any) -> None:
    """Fail at construction, not later inside a DataLoader worker, when ``source`` cannot be
    indexed by an array of rows (a Python list, say)."""
    try:
        default_fetch(source, np.zeros(1, dtype=np.int64))
    except (TypeError, IndexError, KeyError) as exc:
        raise ValueError(
            f"source ({type(source).__name__}) cannot be read by an array of row indices "
            f"({type(exc).__name__}: {exc}); wrap it with numpy.asarray(source), or pass "
            "fetch_callback=lambda source, rows: ... to read rows yourself."
        ) from None


def _read_runs(dataset: Any, indices: IntArray) -> Any:
    if indices.size == 0:
        return dataset[0:0]
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    if len(breaks) > indices.size // 4:  # mostly scattered rows: one point selection is better
        return dataset[indices]
    starts = indices[np.r_[0, breaks]]
    stops = indices[np.r_[breaks - 1, indices.size - 1]] + 1
    return np.concatenate([dataset[int(a) : int(b)] for a, b in zip(starts, stops, strict=True)])


def _source_len(source: Any) -> int:
    shape = getattr(source, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    try:
        return len(source)
    except TypeError:
        raise ValueError(
            f"source ({type(source).__name__}) must have a len() or a shape; FetchDataset "
            "needs to know how many rows it has."
        ) from None


class FetchDataset(IterableDataset[Any]):
    """Batches of ``source`` rows in ``strategy`` order, split over ranks and DataLoader workers.

    ``source``: a numpy array, h5py dataset, backed AnnData, or anything indexable by a sorted
    int array. ``fetch_callback(source, sorted_indices)`` replaces the read,
    ``fetch_transform(data)`` post-processes each fetch, ``batch_callback(data, rows)`` cuts a
    batch (default ``data[rows]``), ``batch_transform(batch)`` post-processes it. ``rank`` /
    ``world_size`` default to the process group, else the torchrun variables. Use with
    ``DataLoader(dataset, batch_size=None, num_workers=...)`` and call :meth:`set_epoch`.

    >>> from rankwise.data import Streaming
    >>> ds = FetchDataset(np.arange(8), Streaming(), batch_size=2, rank=1, world_size=2)
    >>> [b.tolist() for b in ds], len(ds)
    ([[4, 5], [6, 7]], 2)
    """

    def __init__(
        self,
        source: Any,
        strategy: Strategy,
        batch_size: int,
        fetch_factor: int = 16,
        drop_last: bool = False,
        fetch_callback: Callable[[Any, IntArray], Any] | None = None,
        fetch_transform: Callable[[Any], Any] | None = None,
        batch_callback: Callable[[Any, IntArray], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        seed: int | None = 0,
    ) -> None:
        if not isinstance(strategy, Strategy):
            raise ValueError(
                f"strategy ({strategy!r}) must be a Strategy such as rankwise.data.Streaming() "
                "or rankwise.data.BlockShuffling(block_size=64)."
            )
        self.source = source
        self.strategy = strategy
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.fetch_factor = check_int("fetch_factor", fetch_factor, minimum=1)
        self.drop_last = bool(drop_last)
        self.fetch_callback = fetch_callback
        self.fetch_transform = fetch_transform
        self.batch_callback = batch_callback
        self.batch_transform = batch_transform
        self.rank, self.world_size = resolve_world(rank, world_size)
        self.seed = 0 if seed is None else check_int("seed", seed)
        self._n = _source_len(source)
        length = self.strategy.epoch_length(self._n)  # validates the strategy's indices now
        if (
            self.drop_last
            and length
            and not rows_per_rank(length, self.world_size, self.batch_size, True)
        ):
            raise ValueError(
                f"drop_last=True leaves no batch: {length} rows over {self.world_size} ranks is "
                f"fewer than batch_size ({self.batch_size}) rows per rank; lower batch_size, "
                "use fewer ranks, or set drop_last=False."
            )
        if fetch_callback is None and self._n:
            _probe_default_fetch(source)
        # Shared memory made here, in the main process: DataLoader workers (forked, spawned,
        # persistent) hold the same storage, so set_epoch reaches their next __iter__.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """Shuffle differently for ``epoch`` (the same on every rank and worker)."""
        self._epoch.fill_(check_epoch(epoch))

    def _length(self) -> int:
        return self.strategy.epoch_length(self._n)

    def __len__(self) -> int:
        """Batches per epoch on this rank (all its DataLoader workers together)."""
        rows = rows_per_rank(self._length(), self.world_size, self.batch_size, self.drop_last)
        return -(-rows // self.batch_size)

    def fetches(self, worker: int = 0, num_workers: int = 1) -> list[Fetch]:
        """The fetches ``worker`` of this rank reads this epoch."""
        plan = rank_fetches(
            self._length(),
            self.world_size,
            self.rank,
            self.batch_size,
            self.fetch_factor,
            self.drop_last,
        )
        return plan[worker::num_workers]

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        epoch = self.epoch  # read once per pass: this is where set_epoch reaches a worker
        length = self._length()
        for fetch in self.fetches(worker, num_workers):
            positions = np.arange(fetch.start, fetch.stop, dtype=np.int64) % max(length, 1)
            yield from self._read(fetch.fetch_id, positions, epoch)

    def _read(self, fetch_id: int, positions: IntArray, epoch: int) -> Iterator[Any]:
        rows = self.strategy.order(self._n, positions, seed=self.seed, epoch=epoch)
        # One sorted, duplicate-free read (h5py demands both); `where` maps each position of
        # the fetch to its row in the data read.
        unique, where = np.unique(rows, return_inverse=True)
        fetch = self.fetch_callback or default_fetch
        data = fetch(self.source, unique)
        if self.fetch_transform is not None:
            data = self.fetch_transform(data)
        if self.strategy.shuffle_fetch:
            seq = np.random.SeedSequence(self.seed, spawn_key=(epoch, fetch_id))
            where = where[np.random.default_rng(seq).permutation(where.size)]
        for lo in range(0, where.size, self.batch_size):
            picked = where[lo : lo + self.batch_size]
            batch = self.batch_callback(data, picked) if self.batch_callback else data[picked]
            if self.batch_transform is not None:
                batch = self.batch_transform(batch)
            yield batch

    def __repr__(self) -> str:
        return (
            f"FetchDataset(n={self._n}, strategy={self.strategy!r}, batch_size="
            f"{self.batch_size}, fetch_factor={self.fetch_factor}, rank={self.rank}, "
            f"world_size={self.world_size})"
        )
