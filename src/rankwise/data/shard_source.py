"""Several files read as one source: a list of paths or URLs, or a prefix of shards
(``s3://bucket/shards/``, every file under it of one suffix, in sorted key order). Rows are
the files' rows one after the other; a fetch reads, in each file it touches, only its rows'
byte ranges, as a single file's source would::

    shards a.npy (10 rows), b.npy (6 rows): row 12 is b's row 2
    fetch of rows [8, 12): a's rows [8, 10) + b's rows [0, 2) -> one range in each file

Byte ranges are numbered as if the files were laid end to end (file k's bytes start after the
sizes of the files before it), so the local cache keys them as one file's. What a fetch yields
is the files' own fetches joined: arrays stacked, CSR matrices stacked, AnnData concatenated
(``obs`` of each, ``var`` of the first), Parquet rows appended.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np
import numpy.typing as npt

from rankwise.data.range_source import RangeSource, sorted_rows
from rankwise.storage import Storage

__all__ = ["ShardedSource", "check_shards"]

IntArray = npt.NDArray[np.int64]


class ShardedSource(RangeSource):
    """The files ``shards`` (opened sources of one kind) as one source (see the module)."""

    def init_shards(self, shards: list[RangeSource], sizes: list[int]) -> None:
        self.shards = shards
        self.row_starts = np.concatenate([[0], np.cumsum([len(s) for s in shards])]).astype(
            np.int64
        )
        self.byte_starts = [0, *np.cumsum(sizes).tolist()]

    @property
    def shape(self) -> tuple[int, ...]:
        return (int(self.row_starts[-1]), *self.shards[0].shape[1:])

    @property
    def storage(self) -> Storage:
        return self.shards[0].storage  # a prefix's shards share it

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A pickled source (a spawned or forkserver worker's) carries no client: the shards of
        # one folder share one storage again, as open_source made them.
        super().__setstate__(state)
        folders: dict[str, Storage] = {}
        for shard in self.shards:
            if shard._folder in folders:
                shard.share_storage(folders[shard._folder])
            else:
                folders[shard._folder] = shard.storage

    @property
    def requests(self) -> int:
        """GETs this process made, over every shard's storage."""
        return sum(s.requests for s in {id(x.storage): x.storage for x in self.shards}.values())

    def split(self, rows: IntArray) -> list[tuple[int, IntArray]]:
        """``(shard, its local rows)`` for each shard holding some of ``rows`` (sorted)."""
        cuts = np.searchsorted(rows, self.row_starts)
        return [
            (k, rows[cuts[k] : cuts[k + 1]] - self.row_starts[k])
            for k in range(len(self.shards))
            if cuts[k + 1] > cuts[k]
        ]

    def nbytes(self, rows: IntArray) -> int:
        return sum(self.shards[k].nbytes(local) for k, local in self.split(rows))

    def shard_ranges(self, rows: IntArray, page_rows: int) -> list[list[tuple[int, int]]]:
        return [self.shards[k].byte_ranges(local, page_rows) for k, local in self.split(rows)]

    def byte_ranges(self, rows: IntArray, page_rows: int = 0) -> list[tuple[int, int]]:
        out = []
        for (k, _), ranges in zip(
            self.split(rows), self.shard_ranges(rows, page_rows), strict=True
        ):
            base = self.byte_starts[k]
            out += [(a + base, b + base) for a, b in ranges]
        return out

    def fetch_ranges(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes of ``ranges`` (numbered end to end): one read per shard touched."""
        by_shard: dict[int, list[int]] = {}
        for i, (a, _) in enumerate(ranges):
            by_shard.setdefault(bisect.bisect_right(self.byte_starts, a) - 1, []).append(i)
        out: list[bytes] = [b""] * len(ranges)
        for k, indices in by_shard.items():
            base = self.byte_starts[k]
            got = self.shards[k].fetch_ranges(
                [(ranges[i][0] - base, ranges[i][1] - base) for i in indices]
            )
            for i, piece in zip(indices, got, strict=True):
                out[i] = piece
        return out

    def read_rows(self, rows: Any, read: Any = None, page_rows: int = 0) -> Any:
        rows = sorted_rows(rows, len(self))
        per_shard = self.shard_ranges(rows, page_rows)
        pieces = (read or self.fetch_ranges)(self.byte_ranges(rows, page_rows))
        parts, at = [], 0
        for (k, local), ranges in zip(self.split(rows), per_shard, strict=True):
            parts.append(self.shards[k].parse(local, pieces[at : at + len(ranges)]))
            at += len(ranges)
        if not parts:  # no rows: the first shard's empty fetch, of the right kind
            return self.shards[0].parse(rows, [])
        return join(parts)

    def parse(self, rows: IntArray, pieces: list[bytes]) -> Any:
        return self.read_rows(rows, lambda ranges: pieces)


def join(parts: list[Any]) -> Any:
    """The fetches of several shards as one (see the module)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if isinstance(first, np.ndarray):
        return np.concatenate(parts)
    if hasattr(first, "tocsr"):
        import scipy.sparse

        return scipy.sparse.vstack(parts, format="csr")
    if hasattr(first, "obs"):
        import anndata

        joined = anndata.concat(parts, merge="first")
        joined.var = first.var
        return joined
    from rankwise.data.table_source import concat_tables

    return concat_tables(parts)


def check_shards(shards: list[RangeSource], urls: list[str]) -> None:
    """Refuse shards that are not one table: another kind of file, other columns, another
    row shape or dtype; the error names the first shard that differs and how."""
    want = shards[0].form()
    for url, source in zip(urls[1:], shards[1:], strict=True):
        got = source.form()
        if got != want:
            raise ValueError(
                f"shard {url} does not match {urls[0]}: {got} against {want} (kind, row shape, "
                "dtype or columns); every shard of a source must hold rows of the same form."
            )
