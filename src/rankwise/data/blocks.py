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

Resuming (maths in :mod:`rankwise.data.fetch_plan`): the loop calls :meth:`FetchDataset.advance`
after each batch; the count, with the ranks and workers of the pass, fixes which rows were
read, and :meth:`~FetchDataset.state_dict` describes the rest as the unread rest of begun
fetches plus the untouched positions. A pass over a loaded rest splits it like a fresh epoch,
over any ranks and workers.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import IterableDataset, get_worker_info

from rankwise.data.cache import PlanCache, worker_cache
from rankwise.data.fetch_io import default_fetch, probe_default_fetch, source_len
from rankwise.data.fetch_plan import (
    Fetch,
    Piece,
    Work,
    fetch_pieces,
    fold,
    rank_fetches,
    rows_per_rank,
    worker_fetches,
)
from rankwise.data.fetch_state import state_to_work, work_to_state
from rankwise.data.partition import resolve_world
from rankwise.data.permutation import Permutation
from rankwise.data.prefetch import PrefetchStats, prefetched
from rankwise.data.sources import RangeSource, open_source
from rankwise.data.strategies import Strategy
from rankwise.distributed.errors import RankwiseWarning
from rankwise.storage import RetryPolicy, scrub, secret_values
from rankwise.validation import check_epoch, check_int

__all__ = ["Fetch", "FetchDataset", "default_fetch", "rank_fetches", "rows_per_rank"]

# Bytes a DataLoader worker reads ahead of the fetch in use, by default (see prefetch.py).
PREFETCH_BYTES = 64 << 20

# Slots of the dataset's shared int64 tensor (see FetchDataset.__init__).
_EPOCH, _GENERATION, _FRESH, _WORKERS, _CONSUMED = range(5)

IntArray = npt.NDArray[np.int64]


class FetchDataset(IterableDataset[Any]):
    """Batches of ``source`` rows in ``strategy`` order, split over ranks and DataLoader workers.

    ``source``: a numpy array, h5py dataset, backed AnnData, or anything indexable by a sorted
    int array; or a path or URL (local, ``file://``, ``s3://``, ``gs://``, ``az://``,
    ``memory://``) of an ``.npy``, ``.h5`` / ``.hdf5`` (the array named by ``dataset``),
    ``.h5ad`` (its ``X``, dense or CSR, with ``obs`` and ``var``) or ``.parquet`` file (the
    columns named by ``columns``, all by default; a fetch yields
    :class:`~rankwise.data.table_source.TableRows`), or a list of such files or a prefix
    ending in ``/`` read as one source, rows in key order (:mod:`.shard_source`), read in place
    (:mod:`rankwise.data.sources`): metadata once when the dataset is made, then per fetch only
    its rows' byte ranges, merged. ``storage_options`` (fsspec keyword arguments, beside the
    ``AWS_*`` variables) and ``retry`` reach the storage layer; each DataLoader worker reads
    up to ``prefetch_bytes`` of its next fetches ahead, from the plan. ``cache_dir`` and
    ``cache_bytes`` keep what was read on local disk (at most ``cache_bytes`` per rank, split
    over its workers), evicting what the plan needs furthest in the future, keyed by each
    file's version tag (ETag, version id, mtime) recorded when the source is opened, older
    versions' folders removed (:mod:`.cache`; no tag: no cache, and a warning).
    ``fetch_callback(source, sorted_indices)`` replaces the read,
    ``fetch_transform(data)`` post-processes each fetch, ``batch_callback(data, rows)`` cuts a
    batch (default ``data[rows]``), ``batch_transform(batch)`` post-processes it. ``rank`` /
    ``world_size`` default to the process group, else the torchrun variables. Use with
    ``DataLoader(dataset, batch_size=None, num_workers=...)`` and call :meth:`set_epoch`.

    Resuming: call :meth:`advance` in the training loop after each batch (every rank the same
    number of times), save :meth:`state_dict`, and :meth:`load_state_dict` it into a dataset
    built for any number of ranks before building the DataLoader (any ``num_workers``).

    >>> from rankwise.data import Streaming
    >>> ds = FetchDataset(np.arange(8), Streaming(), batch_size=2, rank=1, world_size=2)
    >>> [b.tolist() for b in ds], len(ds)
    ([[4, 5], [6, 7]], 2)
    >>> ds.advance(1)                          # every rank consumed one batch: rows 0-1, 4-5
    >>> one = FetchDataset(np.arange(8), Streaming(), batch_size=2, rank=0, world_size=1)
    >>> one.load_state_dict(ds.state_dict()); [b.tolist() for b in one]
    [[2, 3], [6, 7]]
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
        *,
        dataset: str | None = None,
        columns: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        prefetch_bytes: int = PREFETCH_BYTES,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int = 0,
    ) -> None:
        if not isinstance(strategy, Strategy):
            raise ValueError(
                f"strategy ({strategy!r}) must be a Strategy such as rankwise.data.Streaming() "
                "or rankwise.data.BlockShuffling(block_size=64)."
            )
        if is_location(source):
            source = open_source(
                source,
                dataset=dataset,
                columns=columns,
                storage_options=storage_options,
                retry=retry,
            )
        elif dataset is not None or storage_options is not None or columns is not None:
            raise ValueError(
                f"dataset=, columns= and storage_options= apply to a source given as a path or URL, not "
                f"to a {type(source).__name__}; pass the file's path or URL as the source."
            )
        self.source = source
        self.prefetch_bytes = check_int("prefetch_bytes", prefetch_bytes)
        self.prefetch_stats = PrefetchStats()  # this process's (a worker's are its own)
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.cache_bytes = check_int("cache_bytes", cache_bytes)
        if self.cache_dir is not None and not isinstance(source, RangeSource):
            raise ValueError(
                f"cache_dir={self.cache_dir!r} caches a source given as a path or URL, not a "
                f"{type(source).__name__} (already in memory or on disk); drop cache_dir."
            )
        self.cache: PlanCache | None = None  # this process's last pass's cache
        # The cache folder's name, from the files' versions recorded when the source was opened
        # (here, in the main process): None (no cache) where a file has no version tag.
        self._cache_name: tuple[str, str] | None = None
        if self.cache_dir is not None and self.cache_bytes and isinstance(source, RangeSource):
            self._cache_name = cache_name(source)
            if self._cache_name is None:
                warnings.warn(
                    f"FetchDataset: {scrubbed_url(source)} has no version tag (no ETag, version "
                    "id or modification time), so a rewritten file could not be told from its "
                    f"cached bytes; it is read without the cache (cache_dir={self.cache_dir!r} "
                    "unused). Read it from a store that reports ETags (S3, GCS, Azure, a local "
                    "disk), or drop cache_dir.",
                    RankwiseWarning,
                    stacklevel=2,
                )
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
        self._n = source_len(source)
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
        if fetch_callback is None and self._n and not isinstance(source, RangeSource):
            probe_default_fetch(source)
        self._fresh = Work(length, 0)
        # Where the current pass starts (a fresh epoch, or a loaded / folded rest of one).
        # DataLoader workers hold copies made when they started; `_generation` tells a copy
        # whether its `_base` is still the main process's.
        self._base = self._fresh
        self._generation = 0
        # Shared memory made here, in the main process: DataLoader workers (forked, spawned,
        # persistent) hold the same storage. Slots: the epoch (set_epoch reaches workers'
        # next __iter__), the base's generation, whether that base is a fresh epoch, the
        # workers per rank of the last pass (written by the workers, read by state_dict), and
        # the batches this rank consumed in the current pass (advance).
        self._shared = torch.zeros(5, dtype=torch.int64).share_memory_()
        self._shared[_FRESH] = 1

    # -- epoch, pass and cursor ----------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return int(self._shared[_EPOCH].item())

    def set_epoch(self, epoch: int) -> None:
        """Shuffle differently for ``epoch`` (the same on every rank and worker).

        A new epoch number starts that epoch from its beginning; the current one continues it
        after what :meth:`advance` recorded, so ``set_epoch(e)`` right after loading a state of
        epoch e resumes mid-epoch instead of restarting it.
        """
        epoch = check_epoch(epoch)
        if epoch == self.epoch:
            self._set_base(self._position())
        else:
            self._shared[_EPOCH] = epoch
            self._set_base(self._fresh)

    def advance(self, num_batches: int = 1) -> None:
        """Record that this rank — and, in lockstep, every rank — consumed ``num_batches`` more
        batches of the current pass. Call it in the main process after each step.

        Iterating never moves the cursor: DataLoader workers read ahead of what the model has
        consumed. Which rows those batches were follows from the count, since every rank's
        DataLoader hands out its workers' batches in turn (``in_order=True``, the default).
        """
        num_batches = check_int("num_batches", num_batches)
        done, length = int(self._shared[_CONSUMED].item()), len(self)
        if done + num_batches > length:
            if done != length or num_batches > length:
                raise ValueError(
                    f"advance({num_batches}) passes the end of the pass: {length - done} of "
                    f"{length} batches are left on each rank; call set_epoch(next_epoch) to "
                    "start the next epoch."
                )
            done = 0  # a finished pass iterated again without set_epoch: torch repeats it
        self._shared[_CONSUMED] = done + num_batches

    def _set_base(self, work: Work, reseeded: bool = False) -> None:
        # A worker's copy whose generation is behind may still start a fresh epoch (the seed
        # and the epoch are all it needs) unless the seed itself changed.
        if reseeded or work != self._base:
            self._base = work
            self._generation += 1
            self._shared[_GENERATION] = self._generation
            self._shared[_FRESH] = int(not reseeded and (work == self._fresh or work.done))
        self._shared[_CONSUMED] = 0

    def _pass_work(self) -> Work:
        """The work of the current pass, in the main process or a worker's copy."""
        if int(self._shared[_GENERATION].item()) == self._generation:
            work = self._base
        elif self._shared[_FRESH].item():
            work = self._fresh
        else:
            raise RuntimeError(
                "FetchDataset.load_state_dict() (or set_epoch() after a partial pass) moved the "
                "epoch's start after persistent DataLoader workers copied the dataset; build the "
                "DataLoader after load_state_dict(), or use persistent_workers=False."
            )
        return self._fresh if work.done else work  # a finished epoch repeats, as in torch

    def _position(self) -> Work:
        """The rest of the epoch after the batches :meth:`advance` recorded in this pass."""
        work, batches = self._pass_work(), int(self._shared[_CONSUMED].item())
        if not batches:
            return self._base  # a finished epoch stays finished in state_dict()
        workers = int(self._shared[_WORKERS].item())
        if workers < 1:
            raise RuntimeError(
                "advance() was called but this dataset was never iterated; advance only by "
                "the batches the loop took from a DataLoader over this dataset."
            )
        return fold(
            work,
            self.world_size,
            workers,
            batches,
            self.batch_size,
            self.fetch_factor,
            self.drop_last,
        )

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """A small dict of plain values: the rest of the epoch for the whole world.

        ``consumed`` rows of the epoch's ``length`` are done; ``next`` and ``pieces`` say which
        (fresh positions ``[next, length)`` and the unread rest of begun fetches remain).
        Inside a DataLoader worker (torchdata's StatefulDataLoader asks there) the consumed
        count is unknown, so the state is only a marker that :meth:`load_state_dict` refuses.
        """
        if get_worker_info() is not None:
            return {"in_worker": True}
        return work_to_state(
            self._position(),
            epoch=self.epoch,
            seed=self.seed,
            num_rows=self._n,
            world_size=self.world_size,
            num_workers=max(1, int(self._shared[_WORKERS].item())),
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved epoch under this dataset's ranks and (any) DataLoader workers.

        The state's seed and epoch replace the constructor's: the interrupted order is the one
        that continues. Raises ValueError for a state that does not fit this dataset.
        """
        if get_worker_info() is not None or state.get("in_worker"):
            raise ValueError(
                "FetchDataset resumes from the whole world's state, not a DataLoader worker's: "
                "save ds.state_dict() in the training loop (after ds.advance()) and call "
                "ds.load_state_dict(state) before building the DataLoader, instead of restoring "
                "it through StatefulDataLoader.load_state_dict()."
            )
        work, epoch, seed = state_to_work(state, num_rows=self._n, length=self._fresh.length)
        reseeded, self.seed = seed != self.seed, seed
        self._shared[_EPOCH] = epoch
        self._set_base(work, reseeded)

    # -- the plan ------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches this rank yields in the current pass (all its DataLoader workers together)."""
        total = self._pass_work().total
        rows = rows_per_rank(total, self.world_size, self.batch_size, self.drop_last)
        return -(-rows // self.batch_size)

    def fetches(self, worker: int = 0, num_workers: int = 1) -> list[Fetch]:
        """The fetches ``worker`` of this rank reads in the current pass."""
        plan = rank_fetches(
            self._pass_work().total,
            self.world_size,
            self.rank,
            self.batch_size,
            self.fetch_factor,
            self.drop_last,
        )
        return worker_fetches(plan, worker, num_workers)

    def __iter__(self) -> Iterator[Any]:
        # Read when the first batch is asked for: inside a DataLoader worker an error here
        # reaches the main process with its message (one raised by iter() kills the worker).
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        work, epoch = self._pass_work(), self.epoch
        finished = self._base.done and self._base.length > 0
        if finished or int(self._shared[_CONSUMED].item()) >= len(self) > 0:
            warnings.warn(
                f"FetchDataset: epoch {epoch} was already consumed and is repeated; call "
                f"set_epoch({epoch + 1}) before each epoch.",
                RankwiseWarning,
                stacklevel=2,
            )
        elif work.total and not len(self):
            warnings.warn(
                f"FetchDataset: drop_last=True and the {work.total} rows left of epoch {epoch} "
                f"make no full batch of {self.batch_size} on each of {self.world_size} ranks, so "
                f"this pass is empty; call set_epoch({epoch + 1}) to start the next epoch.",
                RankwiseWarning,
                stacklevel=2,
            )
        self._shared[_WORKERS] = num_workers
        yield from self._batches(work, epoch, worker, num_workers)

    def _batches(self, work: Work, epoch: int, worker: int, num_workers: int) -> Iterator[Any]:
        fetches = self._fetch_rows(work, epoch, worker, num_workers)
        reads: Generator[tuple[Any, IntArray], None, None]
        if self.fetch_callback is None and isinstance(self.source, RangeSource):
            if self.cache_dir is not None and self.cache_bytes and self._cache_name:
                reads = self._cached_reads(self.source, list(fetches), worker, num_workers)
                try:
                    for data, where in reads:
                        yield from self._cut(data, where)
                finally:
                    reads.close()
                return
            # The plan is known: read the next fetches ahead while this one is used.
            source = self.source
            reads = prefetched(
                lambda fetch: (source[fetch[0]], fetch[1]),
                ((fetch, source.nbytes(fetch[0])) for fetch in fetches),
                self.prefetch_bytes,
                stats=self.prefetch_stats,
            )
        else:
            read = self.fetch_callback or default_fetch
            reads = ((read(self.source, unique), where) for unique, where in fetches)
        try:
            for data, where in reads:
                yield from self._cut(data, where)
        finally:
            reads.close()  # stops a prefetch's threads when the loop leaves early

    def _cached_reads(
        self,
        source: RangeSource,
        fetches: list[tuple[IntArray, IntArray]],
        worker: int,
        num_workers: int,
    ) -> Generator[tuple[Any, IntArray], None, None]:
        """The fetches read through this worker's :class:`PlanCache`, which knows the whole
        pass's plan (ranges cut at block boundaries, so the same block is the same entry in
        every epoch), prefetched under the same byte cap."""
        page = int(getattr(self.strategy, "block_size", self.batch_size))
        assert self.cache_dir is not None and self._cache_name is not None
        cache = worker_cache(
            self.cache_dir,
            self._cache_name,
            {"source": scrubbed_url(source), "made_by": "rankwise FetchDataset"},
            self.cache_bytes,
            self.rank,
            self.world_size,
            worker,
            num_workers,
        )
        self.cache = cache
        cache.plan([source.byte_ranges(unique, page) for unique, _ in fetches])
        joined = source.joins_pieces

        def read(item: tuple[int, IntArray, IntArray]) -> tuple[Any, IntArray]:
            index, unique, where = item

            def through_cache(ranges: list[tuple[int, int]]) -> list[Any]:
                if joined:  # cached ranges read from disk straight into the fetch's buffer
                    return [cache.read_joined(index, ranges, source.fetch_ranges)]
                return cache.read(index, ranges, source.fetch_ranges)

            return source.read_rows(unique, through_cache, page), where

        return prefetched(
            read,
            (((i, u, w), source.nbytes(u)) for i, (u, w) in enumerate(fetches)),
            self.prefetch_bytes,
            stats=self.prefetch_stats,
        )

    def _fetch_rows(
        self, work: Work, epoch: int, worker: int, num_workers: int
    ) -> Iterator[tuple[IntArray, IntArray]]:
        """Per fetch of this worker, in order: its sorted unique rows and, for each position of
        the fetch (already in shuffled order), the index of its row among them."""
        plan = rank_fetches(
            work.total,
            self.world_size,
            self.rank,
            self.batch_size,
            self.fetch_factor,
            self.drop_last,
        )
        for fetch in worker_fetches(plan, worker, num_workers):
            real, padding = fetch_pieces(work, fetch)
            positions = np.concatenate([self._positions(p, epoch) for p in real + padding])
            rows = self.strategy.order(self._n, positions, seed=self.seed, epoch=epoch)
            # One sorted, duplicate-free read (h5py demands both).
            unique, where = np.unique(rows, return_inverse=True)
            yield unique, where

    def _positions(self, piece: Piece, epoch: int) -> IntArray:
        start, stop, lo, hi = piece
        if not self.strategy.shuffle_fetch:
            return np.arange(start + lo, start + hi, dtype=np.int64)
        return start + fetch_permutation(stop - start, self.seed, epoch, start).take(lo, hi)

    def _cut(self, data: Any, where: IntArray) -> Iterator[Any]:
        if self.fetch_transform is not None:
            data = self.fetch_transform(data)
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


def is_location(source: Any) -> bool:
    """Whether ``source`` names files (a path or URL, or a non-empty list of them) rather
    than holding rows."""
    if isinstance(source, (str, os.PathLike)):
        return True
    return (
        isinstance(source, (list, tuple))
        and len(source) > 0
        and all(isinstance(s, (str, os.PathLike)) for s in source)
    )


def fetch_permutation(size: int, seed: int, epoch: int, start: int) -> Permutation:
    """The in-memory order of the fetch over epoch positions ``[start, start + size)``: keyed
    by (seed, epoch, start), so it is the same whichever rank or worker reads the fetch.

    rankwise's counter-based :class:`Permutation`, never a numpy / torch RNG stream, so a
    saved state resumes the same rows after an upgrade. ``start + 1`` goes in the seed's
    second 64-bit word: Permutation hashes a seed with its length in words, so these keys
    never meet those of a block order ``Permutation(n, seed, epoch)`` with ``seed < 2**64``.

    >>> fetch_permutation(4, seed=0, epoch=0, start=8).take(0, 4).tolist()
    [2, 0, 1, 3]
    """
    return Permutation(size, seed=((start + 1) << 64) + seed, epoch=epoch)


def cache_name(source: RangeSource) -> tuple[str, str] | None:
    """The cache folder of ``source``, as two digests: of its URL (the folders of one URL's
    versions share it, so a new one replaces the old), and of each file's URL, size and version
    tag (every shard of a prefix; recorded when the source was opened) with what a row is. A
    file rewritten (even at the same size), or a shard added, so never meets the ranges (byte
    offsets) of the old one. None where a file has no version tag: nothing could tell."""
    files = getattr(source, "shards", None) or [source]
    versions = [getattr(f, "file_version", None) for f in files]
    if any(v is None for v in versions):
        return None
    key = (
        [(str(f.url), int(f.file_size), v) for f, v in zip(files, versions, strict=True)],
        source.form(),
        files[0].form(),  # a prefix's shards agree (check_shards)
    )
    return (
        hashlib.sha256(str(source.url).encode()).hexdigest()[:16],
        hashlib.sha256(repr(key).encode()).hexdigest()[:16],
    )


def scrubbed_url(source: RangeSource) -> str:
    """``source``'s URL as messages show it (credentials scrubbed)."""
    return scrub(str(source.url), secret_values(source.storage_options))
