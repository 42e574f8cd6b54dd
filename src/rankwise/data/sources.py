"""A FetchDataset source named by a path or URL, read in place: ``.npy``, ``.h5`` / ``.hdf5``
(a dataset named by ``dataset=``) and ``.h5ad`` (its ``X``, dense or CSR), on a local disk or
in object storage (``s3://``, ``gs://``, ``az://``, ``memory://``), through
:class:`rankwise.storage.Storage`.

Opening reads the metadata once, in a few small ranged reads (an ``.npy`` header; an HDF5
file's object headers, chunk index and an h5ad's ``indptr``, ``obs`` and ``var``); a missing
object fails here, in the main process, naming its URL. Each fetch then reads only its rows'
byte ranges, adjacent ones merged, all in flight at once::

    csr.h5ad, fetch of rows [16, 32) + [96, 112): indptr (in memory) gives elements
    [e16, e32) + [e96, e112) -> 2 ranges of X/data + 2 of X/indices, one read_ranges call

What a fetch of an ``.h5ad`` yields matches ``anndata.read_h5ad(path, backed="r")[rows]
.to_memory()`` for ``X``, ``obs`` and ``var`` (other elements are not read), so
``dense_tensor`` and fetch callbacks written for a backed AnnData work unchanged. A source
pickles as its URL and options only: each process (each DataLoader worker) makes its own
client, and no handle or client is ever in a ``state_dict``.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "x.npy"); np.save(path, np.arange(12).reshape(6, 2))
>>> src = open_source(path); src.shape, src[np.array([1, 2, 5])].tolist()
((6, 2), [[2, 3], [4, 5], [10, 11]])
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rankwise.data.cache import Joined
from rankwise.data.range_source import RangeSource, sorted_rows
from rankwise.data.source_layout import RangeFile, RowLayout, hdf5_layout, npy_layout
from rankwise.storage import RetryPolicy, Storage
from rankwise.validation import installed

__all__ = [
    "ArraySource",
    "CsrSource",
    "H5adSource",
    "RangeSource",
    "open_source",
    "row_runs",
    "sorted_rows",
]

IntArray = npt.NDArray[np.int64]
SUFFIXES = (".npy", ".h5", ".hdf5", ".h5ad", ".parquet")
#: The packages each suffix is read with (all in the ``io`` extra; ``.npy`` needs only numpy).
PACKAGES: dict[str, tuple[str, ...]] = {
    ".npy": (),
    ".h5": ("h5py",),
    ".hdf5": ("h5py",),
    ".h5ad": ("h5py", "anndata"),
    ".parquet": ("pyarrow",),
}


def row_runs(rows: IntArray) -> list[tuple[int, int]]:
    """Runs ``[a, b)`` of consecutive rows in sorted ``rows``.

    >>> row_runs(np.array([1, 2, 3, 7, 9, 10]))
    [(1, 4), (7, 8), (9, 11)]
    """
    if rows.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = rows[np.r_[0, breaks]]
    stops = rows[np.r_[breaks - 1, rows.size - 1]] + 1
    return [(int(a), int(b)) for a, b in zip(starts, stops, strict=True)]


class ArraySource(RangeSource):
    """Rows of a dense array stored as bytes (an ``.npy``, an HDF5 dataset, a dense h5ad X)."""

    def init_array(self, dtype: np.dtype[Any], shape: tuple[int, ...], layout: RowLayout) -> None:
        self.dtype, self._shape, self.layout = dtype, shape, layout

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def nbytes(self, rows: IntArray) -> int:
        return int(rows.size) * self.layout.row_bytes

    def form(self) -> tuple[Any, ...]:
        return ("array", self._shape[1:], str(self.dtype))

    def byte_ranges(self, rows: IntArray, page_rows: int = 0) -> list[tuple[int, int]]:
        return self.layout.ranges(paged(row_runs(rows), page_rows))

    joins_pieces = True

    def parse(self, rows: IntArray, pieces: list[bytes]) -> np.ndarray[Any, Any]:
        # a bytearray: a writable array (a callback may work in place, as on a backed AnnData)
        joined = one_buffer(pieces)
        return np.frombuffer(joined, dtype=self.dtype).reshape(-1, *self._shape[1:])


class CsrSource(RangeSource):
    """Rows of a CSR matrix stored as HDF5 ``data`` / ``indices`` / ``indptr`` (``indptr`` held
    in memory, read once): a fetch reads its rows' elements of ``data`` and ``indices``."""

    def init_csr(
        self,
        indptr: IntArray,
        shape: tuple[int, int],
        data: tuple[np.dtype[Any], RowLayout],
        indices: tuple[np.dtype[Any], RowLayout],
    ) -> None:
        self.indptr, self._shape, self.data, self.indices = indptr, shape, data, indices

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    joins_pieces = True

    def form(self) -> tuple[Any, ...]:
        return ("csr", self._shape[1:], str(self.data[0]))

    def nbytes(self, rows: IntArray) -> int:
        per = self.data[0].itemsize + self.indices[0].itemsize
        return int((self.indptr[rows + 1] - self.indptr[rows]).sum()) * per

    def byte_ranges(self, rows: IntArray, page_rows: int = 0) -> list[tuple[int, int]]:
        # data's ranges, then indices' ranges of the same elements, as many of each
        runs = paged(row_runs(rows), page_rows)
        elements = [(int(self.indptr[a]), int(self.indptr[b])) for a, b in runs]
        data, indices = self.data[1].ranges(elements), self.indices[1].ranges(elements)
        return data + indices

    def parse(self, rows: IntArray, pieces: list[bytes]) -> Any:
        import scipy.sparse

        counts = self.indptr[rows + 1] - self.indptr[rows]
        # one writable copy (a callback may work in place: adata.X.data /= s), viewed twice
        joined = memoryview(one_buffer(pieces))
        split = int(counts.sum()) * self.data[0].itemsize
        values = np.frombuffer(joined[:split], dtype=self.data[0])
        columns = np.frombuffer(joined[split:], dtype=self.indices[0])
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(self.indptr.dtype)
        return scipy.sparse.csr_matrix((values, columns, indptr), shape=(rows.size, self._shape[1]))


class H5adSource(RangeSource):
    """An ``.h5ad`` file's ``X`` (dense or CSR) with its ``obs`` and ``var``: a fetch yields an
    in-memory AnnData, as a backed AnnData's ``adata[rows].to_memory()`` does."""

    def init_h5ad(self, x: ArraySource | CsrSource, obs: Any, var: Any) -> None:
        self.x, self.obs, self.var = x, obs, var

    @property
    def shape(self) -> tuple[int, ...]:
        return self.x.shape

    @property
    def storage(self) -> Storage:
        return self.x.storage  # one client per process, X's

    def share_storage(self, storage: Storage) -> None:
        self.x.share_storage(storage)

    @property
    def joins_pieces(self) -> bool:  # type: ignore[override]
        return self.x.joins_pieces

    def nbytes(self, rows: IntArray) -> int:
        return self.x.nbytes(rows)

    def form(self) -> tuple[Any, ...]:
        """X's form, the genes (a digest of ``var``'s index: their names and order) and
        ``obs``'s columns: shards of other genes or gene order are not one table."""
        genes = hashlib.sha256("\0".join(map(str, self.var.index)).encode()).hexdigest()[:16]
        columns = tuple((str(c), str(t)) for c, t in self.obs.dtypes.items())
        return ("h5ad", *self.x.form(), f"var {len(self.var)} genes {genes}", columns)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["x"] = self.x  # pickles without its client, as this does
        return state

    def byte_ranges(self, rows: IntArray, page_rows: int = 0) -> list[tuple[int, int]]:
        return self.x.byte_ranges(rows, page_rows)

    def parse(self, rows: IntArray, pieces: list[bytes]) -> Any:
        import anndata

        return anndata.AnnData(X=self.x.parse(rows, pieces), obs=self.obs.iloc[rows], var=self.var)

    def fetch_ranges(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        return self.x.fetch_ranges(ranges)

    def fetch_joined(self, ranges: list[tuple[int, int]]) -> Joined:
        return self.x.fetch_joined(ranges)


def one_buffer(pieces: list[Any]) -> Any:
    """``pieces`` as one new writable buffer: joined into a bytearray, or the one piece as it
    is where it is a fetch already joined into a buffer of its own
    (:class:`~rankwise.data.cache.Joined`)."""
    if len(pieces) == 1 and type(pieces[0]) is Joined:
        return pieces[0]
    return bytearray().join(pieces)


def paged(runs: list[tuple[int, int]], page_rows: int) -> list[tuple[int, int]]:
    """``runs`` cut at multiples of ``page_rows`` (0: left whole).

    >>> paged([(3, 9), (12, 13)], 4)
    [(3, 4), (4, 8), (8, 9), (12, 13)]
    """
    if page_rows <= 0:
        return runs
    out = []
    for a, b in runs:
        while a < b:
            end = min(b, (a // page_rows + 1) * page_rows)
            out.append((a, end))
            a = end
    return out


def open_source(
    url: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    dataset: str | None = None,
    columns: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> RangeSource:
    """Open the file ``url`` (a local path or an fsspec URL) by its suffix (see the module):
    ``.npy``, ``.h5`` / ``.hdf5`` (``dataset`` names the array), ``.h5ad`` or ``.parquet``
    (``columns`` names the columns, all by default). A list of them, or a prefix ending in
    ``/`` (every file under it, in sorted key order), opens as one source
    (:mod:`rankwise.data.shard_source`). Reads its metadata now; a missing object raises
    FileNotFoundError naming the URL, a store that cannot be read
    :class:`~rankwise.storage.StorageError` naming it and the fix."""
    options: dict[str, Any] = {"dataset": dataset, "columns": columns}
    options["storage_options"] = storage_options
    if not isinstance(url, (str, os.PathLike)):
        return open_shards([os.fspath(u) for u in url], url, retry=retry, **options)
    url = os.fspath(url)
    if url.endswith("/"):
        return open_shards(shard_urls(url, storage_options, retry), url, retry=retry, **options)
    return open_file(url, retry=retry, **options)


def shard_urls(
    prefix: str, storage_options: dict[str, Any] | None, retry: RetryPolicy | None
) -> list[str]:
    """The URLs of the files directly under ``prefix`` (sorted by key)."""
    folder = Storage.for_url(prefix.rstrip("/"), storage_options, retry=retry)
    names = folder.names()
    if not names:
        raise FileNotFoundError(
            f"FetchDataset source {folder.display_url}/ holds no files; check the prefix (a "
            "source ending in '/' reads every file under it) and that the shards were uploaded."
        )
    return [f"{prefix.rstrip('/')}/{name}" for name in names]


def open_shards(
    urls: list[str],
    given: Any,
    *,
    dataset: str | None,
    columns: Sequence[str] | None,
    storage_options: dict[str, Any] | None,
    retry: RetryPolicy | None,
) -> RangeSource:
    from rankwise.data.shard_source import ShardedSource, check_shards

    if not urls:
        raise ValueError(
            "FetchDataset source is an empty list of files; pass one path or URL, a list of "
            "them, or a prefix ending in '/'."
        )
    suffixes = sorted({os.path.splitext(u)[1].lower() for u in urls})
    if len(suffixes) > 1:
        raise ValueError(
            f"FetchDataset source {given!r} mixes files of suffixes {suffixes}; its shards "
            "must be of one format: put other files under another prefix, or pass a list."
        )
    folders: dict[str, Storage] = {}  # one client per folder: a prefix's shards share one
    shards = []
    for u in urls:
        folder = u.rstrip("/").rpartition("/")[0] or "."
        if folder not in folders:
            folders[folder] = Storage.for_url(folder, storage_options, retry=retry)
        shards.append(
            open_file(
                u,
                dataset=dataset,
                columns=columns,
                storage_options=storage_options,
                retry=retry,
                storage=folders[folder],
            )
        )
    check_shards(shards, urls)
    joined = ShardedSource(given if isinstance(given, str) else "\n".join(urls), storage_options)
    joined.init_shards(shards, [int(shard.file_size) for shard in shards])
    return joined


def open_file(
    url: str,
    *,
    dataset: str | None,
    columns: Sequence[str] | None,
    storage_options: dict[str, Any] | None,
    retry: RetryPolicy | None,
    storage: Storage | None = None,
) -> RangeSource:
    """One file's source (see :func:`open_source`), read through ``storage`` (its folder's,
    already made) where given."""
    suffix = os.path.splitext(url.rstrip("/"))[1].lower()
    if suffix not in SUFFIXES:
        raise ValueError(
            f"source {url!r} has no suffix FetchDataset can open ({', '.join(SUFFIXES)}); "
            "rename it, or open it yourself and pass the array (or h5py dataset, or backed "
            "AnnData) as the source."
        )
    for module in PACKAGES[suffix]:
        if not installed(module):
            raise ImportError(
                f"FetchDataset reads {suffix} files with {module}, which is not installed: "
                f"pip install 'rankwise[io]' (or pip install {module})."
            )
    if suffix == ".h5ad" and dataset is not None:
        raise ValueError(
            f"dataset={dataset!r} is for .h5 / .hdf5 files; an .h5ad source reads its X."
        )
    if suffix in (".h5", ".hdf5") and not dataset:
        raise ValueError(
            f"source {url!r} is an HDF5 file: name the array to read, e.g. "
            "FetchDataset(url, strategy, batch_size, dataset='features')."
        )
    if columns is not None and suffix != ".parquet":
        raise ValueError(
            f"columns={list(columns)!r} is for .parquet files; {url!r} is a {suffix} file "
            "(drop columns=)."
        )
    probe = RangeSource(url, storage_options, retry)
    if storage is not None:
        probe.share_storage(storage)
    where = probe.storage.url_of(probe.key)
    try:
        stat = probe.storage.stat(probe.key)  # size and version, read once, here
    except FileNotFoundError:
        raise FileNotFoundError(
            f"FetchDataset source {where} does not exist; check the URL (bucket, prefix and "
            "file name) and that the file was uploaded."
        ) from None
    source = read_metadata(probe, suffix, stat.size, where, dataset, columns)
    source.file_size, source.file_version = stat.size, stat.version
    source.share_storage(probe.storage)
    return source


def read_metadata(
    probe: RangeSource,
    suffix: str,
    size: int,
    where: str,
    dataset: str | None,
    columns: Sequence[str] | None,
) -> RangeSource:
    url, storage_options, retry = probe.url, probe.storage_options, probe.retry
    if suffix == ".npy":
        source = ArraySource(url, storage_options, retry)
        source.init_array(*npy_layout(probe.read, size, where))
        return source
    if suffix == ".parquet":
        from rankwise.data.table_source import ParquetSource, parquet_metadata

        table = ParquetSource(url, storage_options, retry)
        wanted = None if columns is None else [str(c) for c in columns]
        table.init_parquet(parquet_metadata(probe.read, size, where), wanted, where, size)
        return table
    import h5py

    with h5py.File(RangeFile(probe.read, size), "r") as f:
        if suffix == ".h5ad":
            h5ad = H5adSource(url, storage_options, retry)
            h5ad.init_h5ad(_h5ad_x(f, url, storage_options, retry, where), *_h5ad_frames(f))
            return h5ad
        assert dataset is not None
        if dataset not in f or not isinstance(f[dataset], h5py.Dataset):
            raise ValueError(
                f"{where} has no dataset {dataset!r}; it holds {_datasets(f)}: pass one as "
                "dataset=."
            )
        array = ArraySource(url, storage_options, retry)
        ds = f[dataset]
        array.init_array(ds.dtype, tuple(ds.shape), hdf5_layout(ds, where))
        return array


def _h5ad_x(
    f: Any, url: str, options: dict[str, Any] | None, retry: RetryPolicy | None, where: str
) -> ArraySource | CsrSource:
    if "X" not in f:
        raise ValueError(
            f"{where} has no X matrix; read a layer with an h5py source instead, e.g. "
            "FetchDataset(url.replace('.h5ad', '.h5'), ..., dataset='layers/counts')."
        )
    x = f["X"]
    encoding = x.attrs.get("encoding-type", "array")
    encoding = encoding.decode() if isinstance(encoding, bytes) else str(encoding)
    if encoding == "array":
        dense = ArraySource(url, options, retry)
        dense.init_array(x.dtype, tuple(x.shape), hdf5_layout(x, where))
        return dense
    if encoding != "csr_matrix":
        raise ValueError(
            f"{where}: X is stored as {encoding}; FetchDataset reads rows of a dense or CSR X. "
            "Convert it once: adata.X = scipy.sparse.csr_matrix(adata.X); adata.write_h5ad(...)."
        )
    shape = tuple(int(v) for v in x.attrs["shape"])
    csr = CsrSource(url, options, retry)
    csr.init_csr(
        np.asarray(x["indptr"][:], dtype=np.int64),
        (shape[0], shape[1]),
        (x["data"].dtype, hdf5_layout(x["data"], where)),
        (x["indices"].dtype, hdf5_layout(x["indices"], where)),
    )
    return csr


def _h5ad_frames(f: Any) -> tuple[Any, Any]:
    from anndata.io import read_elem

    return read_elem(f["obs"]), read_elem(f["var"])


def _datasets(f: Any) -> list[str]:
    names: list[str] = []
    f.visititems(lambda name, obj: names.append(name) if hasattr(obj, "dtype") else None)
    return names[:20]
