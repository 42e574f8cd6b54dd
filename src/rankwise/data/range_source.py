"""The base of every source FetchDataset reads in place from a path or URL: a file's storage
(made anew in each process), its key, and the three steps of a read (the byte ranges of some
rows, their bytes, what they parse to). Kept apart from :mod:`rankwise.data.sources` so the
sources of other formats (:mod:`.table_source`, :mod:`.shard_source`) build on it without
importing the opener that imports them.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from rankwise.data.cache import Joined, joined_buffer
from rankwise.storage import RetryPolicy, Storage

__all__ = ["RangeSource", "in_worker", "sorted_rows"]

IntArray = npt.NDArray[np.int64]


class RangeSource:
    """What every source here shares: the file's storage (made anew in each process), its
    key, and :meth:`nbytes` (what reading some rows costs, for the prefetch's byte cap)."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.retry = retry
        folder, _, self.key = url.rstrip("/").rpartition("/")
        self._folder = folder or "."
        self._storage: Storage | None = None
        self._storage_lock = threading.Lock()  # a worker's prefetch threads make it once
        self.file_size = 0  # the object's bytes, once opened
        # its version tag, recorded with the size when opened (Storage.stat): what the local
        # cache keys it by; None: the store gives none, so the source is never cached
        self.file_version: str | None = None

    @property
    def storage(self) -> Storage:
        """The file's storage. Its client is this process's own: a forked DataLoader worker's
        first call builds a new one (:class:`~rankwise.storage.Storage` sees the fork), and a
        pickled source (a spawned worker's) carries none."""
        with self._storage_lock:
            if self._storage is None:
                self._storage = Storage.for_url(
                    self._folder, self.storage_options, retry=self.retry
                )
            return self._storage

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_storage"] = None  # a client never crosses processes
        state.pop("_storage_lock", None)  # nor a lock
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._storage_lock = threading.Lock()

    def share_storage(self, storage: Storage) -> None:
        """Read through ``storage`` (this process's, already made) instead of a new one."""
        self._storage = storage

    def read(self, start: int, stop: int) -> bytes:
        return self.storage.read_ranges(self.key, [(start, stop)])[0]

    def size(self) -> int:
        """The object's size (a missing object: FileNotFoundError naming the URL)."""
        return self.storage.size(self.key)

    # Whether parse only joins the pieces (in order) before reading them: then a fetch may
    # hand it the pieces already joined, one buffer (the cache does: PlanCache.read_joined).
    joins_pieces = False

    def nbytes(self, rows: IntArray) -> int:
        raise NotImplementedError

    def form(self) -> tuple[Any, ...]:
        """What a row is (kind, row shape, dtype or columns): shards of one source agree."""
        return (type(self).__name__, tuple(self.shape[1:]))

    def byte_ranges(self, rows: IntArray, page_rows: int = 0) -> list[tuple[int, int]]:
        """The byte ranges holding ``rows`` (sorted, unique), in the order :meth:`parse`
        takes them; with ``page_rows``, cut at multiples of it, so a range is the same
        whichever fetch reads it (what a cache keys by)."""
        raise NotImplementedError

    def parse(self, rows: IntArray, pieces: list[bytes]) -> Any:
        """What a fetch of ``rows`` yields, from the bytes of :meth:`byte_ranges`."""
        raise NotImplementedError

    def read_rows(self, rows: Any, read: Any = None, page_rows: int = 0) -> Any:
        """Rows ``rows`` read through ``read(ranges) -> pieces`` (default: the storage)."""
        rows = sorted_rows(rows, len(self))
        if read is None:
            read = (lambda r: [self.fetch_joined(r)]) if self.joins_pieces else self.fetch_ranges
        return self.parse(rows, read(self.byte_ranges(rows, page_rows)))

    def fetch_ranges(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes of ``ranges`` of the file, from the store (merged, retried)."""
        # buffers: a piece may be a memoryview; every parse joins or decodes it, copying once
        return self.storage.read_ranges(self.key, ranges, fork_safe=not in_worker(), buffers=True)

    def fetch_joined(self, ranges: list[tuple[int, int]]) -> Joined:
        """The bytes of ``ranges`` joined in their order into one new buffer (what a source
        that :attr:`joins_pieces` parses as it is): a local file's read straight into it."""
        out = joined_buffer(sum(max(b - a, 0) for a, b in ranges))
        self.storage.read_ranges_into(self.key, ranges, out, fork_safe=not in_worker())
        return out

    def __getitem__(self, rows: Any) -> Any:
        return self.read_rows(rows)

    def __len__(self) -> int:
        return int(self.shape[0])

    @property
    def shape(self) -> tuple[int, ...]:
        raise NotImplementedError


def in_worker() -> bool:
    """Whether this is a DataLoader worker: a process that never forks, so the storage may use
    its fastest ranged client (obstore's runtime does not survive a fork)."""
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


def sorted_rows(rows: Any, n: int) -> IntArray:
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if rows.size and (np.any(np.diff(rows) <= 0) or rows[0] < 0 or rows[-1] >= n):
        raise IndexError(f"rows must be sorted, unique and in [0, {n}); got {rows[:8]}...")
    return rows
