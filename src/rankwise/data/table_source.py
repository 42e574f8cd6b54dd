"""A Parquet file read in place: rows are the table's rows, a fetch reads the column chunks of
the row groups holding its rows (one ranged read each, all in flight at once), decoded by
pyarrow from those bytes alone.

Opening reads the footer once (its last 8 bytes give the metadata's length, then the metadata;
a small file is one read), parsed by pyarrow. A fetch then costs, per row group it touches,
one range per column read::

    3 row groups of 100 rows, columns a, b; fetch of rows [16, 32) + [240, 256):
    row groups 0 and 2 -> 4 ranges (a and b of each), one read_ranges call

Parquet compresses and encodes a column chunk as a whole, so a row group is the smallest
read: write the file with row groups near the fetch's size (``pyarrow.parquet.write_table(t,
path, row_group_size=...)``) when fetches are small and scattered.

A fetch yields :class:`TableRows`: columns by name as numpy arrays, rows taken by an index
array (what FetchDataset's batches do), and ``numpy.asarray`` of the numeric columns side by
side (what ``dense_tensor`` gives).

>>> rows = TableRows({"a": np.arange(4), "b": np.arange(4) * 0.5})
>>> rows[np.array([3, 1])]["b"].tolist(), np.asarray(rows[np.array([2])]).tolist()
([1.5, 0.5], [[2.0, 1.0]])
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np
import numpy.typing as npt

from rankwise.data.range_source import RangeSource
from rankwise.data.source_layout import SeekableFile

__all__ = ["ParquetSource", "TableRows"]

IntArray = npt.NDArray[np.int64]
FOOTER = 64 << 10  # the first read from a Parquet file's end: its metadata, in most files


def parquet_metadata(read: Any, size: int, where: str) -> Any:
    """A Parquet file's metadata from its footer: one read of its last bytes (two when the
    metadata is larger than :data:`FOOTER`), parsed by pyarrow."""
    import pyarrow
    import pyarrow.parquet as pq

    tail = read(max(0, size - FOOTER), size)
    if size < 12 or tail[-4:] != b"PAR1":
        raise ValueError(
            f"{where} is not a Parquet file (no PAR1 footer); write it with "
            "pyarrow.parquet.write_table or DataFrame.to_parquet."
        )
    length = int.from_bytes(tail[-8:-4], "little") + 8
    if length > len(tail):
        tail = read(max(0, size - length), size)
    held = PiecesFile([(size - len(tail), size)], [tail], read, size)
    try:
        return pq.read_metadata(held)
    except (OSError, pyarrow.ArrowException) as e:
        raise ValueError(
            f"{where}: its Parquet footer cannot be read ({e}); write it again."
        ) from None


class TableRows:
    """Rows of a table as numpy columns (see the module): ``rows["name"]`` is a column,
    ``rows[indices]`` the rows ``indices``, ``len(rows)`` their number, ``numpy.asarray(rows)``
    the numeric columns as one ``(rows, features)`` array (a fixed-size list column gives as
    many features as its length)."""

    def __init__(self, columns: dict[str, np.ndarray[Any, Any]]) -> None:
        self.columns = columns

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return self.columns[key]
        return TableRows({name: values[key] for name, values in self.columns.items()})

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        parts = []
        for name, values in self.columns.items():
            if values.dtype.kind not in "biuf":
                raise TypeError(
                    f"column {name!r} holds {values.dtype} values, not numbers, so the rows "
                    "are no numeric array; read only numeric columns (columns=[...]) or pass "
                    "batch_transform= to turn this column into numbers."
                )
            parts.append(values.reshape(len(values), -1))
        joined = np.concatenate(parts, axis=1) if parts else np.zeros((len(self), 0))
        return joined if dtype is None else joined.astype(dtype)

    def to_pandas(self) -> Any:
        """The rows as a pandas DataFrame (a fixed-size list column as lists)."""
        import pandas as pd

        return pd.DataFrame(
            {k: list(v) if v.ndim > 1 else v for k, v in self.columns.items()}, copy=False
        )

    def __repr__(self) -> str:
        return f"TableRows({len(self)} rows, columns {list(self.columns)})"


def concat_tables(parts: list[TableRows]) -> TableRows:
    """Rows of several tables with the same columns, one after the other."""
    return TableRows({k: np.concatenate([p.columns[k] for p in parts]) for k in parts[0].columns})


class ParquetSource(RangeSource):
    """Rows of a Parquet file's columns (see the module)."""

    def init_parquet(
        self, metadata: Any, columns: list[str] | None, where: str, file_size: int
    ) -> None:
        self.metadata, self.file_size = metadata, file_size
        names = list(metadata.schema.to_arrow_schema().names)
        if columns is not None:
            missing = [c for c in columns if c not in names]
            if missing or not columns:
                raise ValueError(
                    f"{where} has no column {missing[0] if missing else '(none asked)'!r}; its "
                    f"columns are {names[:20]}: pass some of them as columns=."
                )
        self.columns = list(names if columns is None else columns)
        groups = metadata.num_row_groups
        self.group_rows = [metadata.row_group(g).num_rows for g in range(groups)]
        self.group_starts = np.concatenate([[0], np.cumsum(self.group_rows)]).astype(np.int64)
        wanted = set(self.columns)
        self.chunks: list[list[tuple[int, int]]] = []  # per row group, its columns' bytes
        self.row_cost: list[float] = []  # per row group, decoded bytes per row
        for g in range(groups):
            group = metadata.row_group(g)
            chunks, decoded = [], 0
            for c in range(group.num_columns):
                column = group.column(c)
                if column.path_in_schema.split(".")[0] not in wanted:
                    continue
                start = column.data_page_offset
                if column.has_dictionary_page and column.dictionary_page_offset:
                    start = min(start, column.dictionary_page_offset)
                chunks.append((start, start + column.total_compressed_size))
                decoded += column.total_uncompressed_size
            self.chunks.append(chunks)
            self.row_cost.append(decoded / max(1, group.num_rows))

    @property
    def shape(self) -> tuple[int, ...]:
        return (int(self.group_starts[-1]), len(self.columns))

    def form(self) -> tuple[Any, ...]:
        schema = self.metadata.schema.to_arrow_schema()
        return ("parquet", tuple((c, str(schema.field(c).type)) for c in self.columns))

    def groups_of(self, rows: IntArray) -> IntArray:
        """The row groups holding ``rows`` (sorted), each once."""
        return np.unique(np.searchsorted(self.group_starts, rows, side="right") - 1)

    def nbytes(self, rows: IntArray) -> int:
        # what a fetch holds: its row groups' decoded columns, until its rows are taken
        groups = self.groups_of(rows)
        return int(sum(self.row_cost[g] * self.group_rows[g] for g in groups))

    def byte_ranges(self, rows: IntArray, page_rows: int = 0) -> list[tuple[int, int]]:
        # a column chunk is the same whichever fetch reads it: page_rows changes nothing
        return [r for g in self.groups_of(rows) for r in self.chunks[g]]

    def parse(self, rows: IntArray, pieces: list[bytes]) -> TableRows:
        import pyarrow.parquet as pq

        groups = self.groups_of(rows)
        ranges = self.byte_ranges(rows)
        # pre_buffer=False: pyarrow reads each column chunk exactly, not a span over others
        held = PiecesFile(ranges, pieces, self.read, self.file_size)
        table = pq.ParquetFile(held, metadata=self.metadata, pre_buffer=False).read_row_groups(
            [int(g) for g in groups], columns=self.columns, use_threads=False
        )
        first = self.group_starts[groups]
        sizes = np.asarray(self.group_rows, dtype=np.int64)[groups]
        base = np.concatenate([[0], np.cumsum(sizes)[:-1]])  # each group's first row in `table`
        where = np.searchsorted(self.group_starts[groups + 1], rows, side="right")
        local = rows - first[where] + base[where]
        return TableRows({name: column_array(table.column(name), local) for name in self.columns})


def column_array(column: Any, rows: IntArray) -> np.ndarray[Any, Any]:
    """Rows ``rows`` of a pyarrow column as numpy: numbers as themselves, a fixed-size list
    as a 2-D array, anything else (strings, nested values) as objects."""
    import pyarrow as pa

    taken = column.take(pa.array(rows)).combine_chunks()
    if pa.types.is_fixed_size_list(taken.type):
        width = taken.type.list_size
        return np.asarray(taken.flatten().to_numpy(zero_copy_only=False)).reshape(-1, width)
    return np.asarray(taken.to_numpy(zero_copy_only=False))


class PiecesFile(SeekableFile):
    """A read-only file holding only the bytes of ``ranges`` (their ``pieces``): what pyarrow
    decodes a fetch's column chunks from. A read outside them (pyarrow reading more than the
    chunk the metadata gives, as some writers' files need) goes to ``read(start, stop)``."""

    def __init__(self, ranges: list[tuple[int, int]], pieces: list[bytes], read: Any, size: int):
        # SEEK_END is never used with metadata given; the size is the metadata's, as a bound
        super().__init__(size)
        order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
        self._starts = [ranges[i][0] for i in order]
        self._pieces = [pieces[i] for i in order]
        self._read = read

    def readinto(self, buffer: Any) -> int:
        want = len(memoryview(buffer).cast("B"))
        i = bisect.bisect_right(self._starts, self._pos) - 1
        if i >= 0 and self._pos + want <= self._starts[i] + len(self._pieces[i]):
            skip = self._pos - self._starts[i]
            piece = memoryview(self._pieces[i])[skip : skip + want]
        else:
            piece = memoryview(self._read(self._pos, self._pos + want))
        memoryview(buffer).cast("B")[: len(piece)] = piece
        self._pos += len(piece)
        return len(piece)
