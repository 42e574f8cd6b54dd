"""FetchDataset over a file read in place from object storage (the real SeaweedFS S3 server of
tests/conftest.py): the batches of a URL equal those of the local file, on 2 ranks x 2 real
DataLoader workers (forked, each with its own client), for every format; a resume moves from
2 ranks to 3 exactly once; a missing object, wrong keys and a store that never answers each
fail with an error naming the URL; the prefetch holds its byte cap; and a fetch costs about
one ranged GET per block per array."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.utils.data

from rankwise.data import BlockShuffling, FetchDataset, Streaming
from rankwise.data.fetch_io import dense_tensor
from rankwise.storage import RetryPolicy, Storage, StorageError, StorageWarning

pytestmark = pytest.mark.timeout(120)

ROWS, COLS = 96, 6


def _write(tmp_path: Path, fmt: str) -> tuple[Path, dict[str, Any]]:
    """A small file of ``fmt`` whose row i is recognisable (its first column is i)."""
    values = np.arange(ROWS, dtype=np.float32)[:, None] + np.zeros((1, COLS), np.float32)
    values[:, 1:] = (np.arange(ROWS * (COLS - 1)) % 7 == 0).reshape(ROWS, COLS - 1) * 2.5
    if fmt == "npy":
        path = tmp_path / "x.npy"
        np.save(path, values)
        return path, {}
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "x.parquet"
        table = {f"c{j}": values[:, j] for j in range(COLS)}
        table["name"] = [f"cell{i}" for i in range(ROWS)]  # a column a fetch may leave unread
        pq.write_table(pa.table(table), path, row_group_size=16)
        return path, {"columns": [f"c{j}" for j in range(COLS)]}
    if fmt == "h5":
        import h5py

        path = tmp_path / "x.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("cells/features", data=values, chunks=(10, COLS))
        return path, {"dataset": "cells/features"}
    import anndata
    import pandas as pd
    import scipy.sparse

    path = tmp_path / f"x-{fmt}.h5ad"
    x = scipy.sparse.csr_matrix(values) if fmt == "h5ad-csr" else values
    obs = pd.DataFrame({"n": np.arange(ROWS)}, index=[f"cell{i}" for i in range(ROWS)])
    anndata.AnnData(X=x, obs=obs).write_h5ad(path)
    return path, {}


FORMATS = ("npy", "h5", "h5ad-csr", "h5ad-dense", "parquet")


@pytest.fixture(scope="module")
def files(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each format's file written once for the module, on disk and uploaded to a bucket of its
    own: ``{fmt: (path, url, options)}`` (a test reaches the bucket through the ``AWS_*``
    variables its ``s3_bucket`` sets)."""
    import uuid

    from rankwise.testing.s3server import S3_KEY, S3_SECRET

    folder = tmp_path_factory.mktemp("fetch-remote")
    bucket = f"s3://rankwise-{uuid.uuid4().hex[:16]}"
    options = {"endpoint_url": s3_server.endpoint, "key": S3_KEY, "secret": S3_SECRET}
    store = Storage.for_url(bucket, options)
    import s3fs

    s3fs.S3FileSystem(
        skip_instance_cache=True,
        key=S3_KEY,
        secret=S3_SECRET,
        endpoint_url=s3_server.endpoint,
    ).mkdir(bucket)
    out = {}
    for fmt in FORMATS:
        path, fmt_options = _write(folder, fmt)
        store.put(path, path.name)
        out[fmt] = (path, f"{bucket}/{path.name}", fmt_options)
    # shards: the .npy's rows in three files of 40, 1 and 55 rows under a prefix, keys sorted
    values = np.load(out["npy"][0])
    cuts = {"part-0": (0, 40), "part-1": (40, 41), "part-2": (41, ROWS)}
    for name, (a, b) in cuts.items():
        np.save(folder / f"{name}.npy", values[a:b])
        store.put(folder / f"{name}.npy", f"shards/{name}.npy")
    out["shards"] = (out["npy"][0], f"{bucket}/shards/", {})
    return out


def _as_rows(batch: Any) -> list[list[float]]:
    return dense_tensor(batch).tolist()


def _rank_dataset(source: Any, rank: int, **options: Any) -> FetchDataset:
    ds = FetchDataset(
        source,
        BlockShuffling(block_size=4),
        batch_size=8,
        fetch_factor=2,
        rank=rank,
        world_size=2,
        seed=3,
        **options,
    )
    ds.set_epoch(1)
    return ds


def _rank_batches(source: Any, rank: int, **options: Any) -> list[Any]:
    return [_as_rows(b) for b in _rank_dataset(source, rank, **options)]


class _Tagged(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """A dataset's batches as ``(tag, rows)``: several datasets chained through one DataLoader
    (one start of its workers) stay apart."""

    def __init__(self, tag: str, dataset: FetchDataset) -> None:
        self.tag, self.dataset = tag, dataset

    def __iter__(self) -> Any:
        return ((self.tag, _as_rows(b)) for b in self.dataset)


def _local(fmt: str, path: Path, options: dict[str, Any]) -> Any:
    """The source users pass today for the same file."""
    if fmt.startswith("h5ad"):
        import anndata

        return anndata.read_h5ad(path, backed="r")
    if fmt == "h5":
        import h5py

        return h5py.File(path, "r")[options["dataset"]]
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path, columns=options["columns"]).to_pandas().to_numpy()
    return np.load(path)  # "shards": the file they were cut from


def test_url_batches_equal_the_local_files_on_two_ranks_and_two_workers(
    s3_bucket: str, files: dict[str, Any], tmp_path: Path
):
    expected: dict[str, list[Any]] = {}
    chained = []
    for fmt, (path, url, options) in files.items():
        seen = []
        for rank in range(2):
            want = _rank_batches(_local(fmt, path, options), rank)
            if fmt != "shards":
                assert _rank_batches(str(path), rank, **options) == want  # a local path
            expected[f"{fmt}/{rank}"] = want
            seen += [row[0] for batch in want for row in batch]
            # rank 1's workers read through the local cache: it changes no row either
            cache = {"cache_dir": tmp_path / f"cache-{fmt}", "cache_bytes": 1 << 20} if rank else {}
            chained.append(_Tagged(f"{fmt}/{rank}", _rank_dataset(url, rank, **options, **cache)))
        assert sorted(seen) == list(range(ROWS))
    # One DataLoader start for every format and rank: two forked workers, each with its own
    # client, read the same fetches into the same batches; the DataLoader interleaves them
    # (worker 0's first, worker 1's first, ...), which sorting the batches undoes.
    loader = torch.utils.data.DataLoader(
        torch.utils.data.ChainDataset(chained), batch_size=None, num_workers=2
    )
    got: dict[str, list[Any]] = {tag: [] for tag in expected}
    for tag, rows in loader:
        got[tag].append(rows)
    for tag, want in expected.items():
        assert sorted(got[tag]) == sorted(want), tag


def test_an_h5ad_fetch_is_the_backed_anndatas_to_memory(s3_bucket: str, files: dict[str, Any]):
    import anndata

    path, url, _ = files["h5ad-csr"]
    ds = FetchDataset(url, Streaming(), batch_size=5, fetch_factor=3)
    backed = anndata.read_h5ad(path, backed="r")
    rows = np.array([3, 4, 5, 40, 95])
    got, want = ds.source[rows], backed[rows].to_memory()
    assert (got.X != want.X).nnz == 0 and got.X.dtype == want.X.dtype
    assert got.obs.equals(want.obs) and got.var.equals(want.var)


def test_a_fetched_batch_may_be_changed_in_place(s3_bucket: str, files: dict[str, Any]):
    rows = np.array([3, 4, 5, 40, 95])
    for fmt in ("npy", "h5ad-dense", "h5ad-csr"):
        url = files[fmt][1]
        got = FetchDataset(url, Streaming(), batch_size=5).source[rows]
        x = got if fmt == "npy" else got.X
        if fmt == "h5ad-csr":
            assert x.data.flags.writeable and x.indices.flags.writeable
            x.data /= 2  # a callback normalising in place, as on a backed AnnData
            assert dense_tensor(x).tolist() == (_as_rows(np.load(_npy(files))[rows] / 2))
        else:
            assert x.flags.writeable
            np.log1p(x, out=x)
            assert x.tolist() == np.log1p(np.load(_npy(files))[rows]).tolist()


def _npy(files: dict[str, Any]) -> Path:
    return Path(files["npy"][0])


def test_resume_from_two_ranks_to_three_is_exactly_once(s3_bucket: str, files: dict[str, Any]):
    _, url, _ = files["npy"]

    def dataset(rank: int, world: int) -> FetchDataset:
        ds = FetchDataset(url, BlockShuffling(block_size=4), 4, 2, rank=rank, world_size=world)
        ds.set_epoch(2)
        return ds

    before = [dataset(r, 2) for r in range(2)]
    seen = []
    for ds in before:
        batches = iter(ds)
        seen += [int(row[0]) for _ in range(3) for row in next(batches)]
        ds.advance(3)
    state = before[0].state_dict()
    assert state == before[1].state_dict()
    json.dumps(state)  # plain values: no file handle, no client
    assert state["consumed"] == 2 * 3 * 4  # the rest, 72 rows, splits over 3 ranks unpadded
    for rank in range(3):
        ds = FetchDataset(url, BlockShuffling(block_size=4), 4, 2, rank=rank, world_size=3)
        ds.load_state_dict(state)
        ds.set_epoch(2)
        seen += [int(row[0]) for batch in ds for row in batch]
    assert sorted(seen) == list(range(ROWS))


def test_the_prefetch_holds_its_byte_cap_and_reads_about_one_get_per_block(
    s3_bucket: str, files: dict[str, Any]
):
    path, url, _ = files["h5ad-csr"]
    local = FetchDataset(str(path), BlockShuffling(block_size=4), 8, fetch_factor=2, seed=1)
    fetch_bytes = max(local.source.nbytes(np.arange(i, i + 16)) for i in range(0, ROWS, 16))
    cap = 3 * fetch_bytes
    ds = FetchDataset(
        url, BlockShuffling(block_size=4), 8, fetch_factor=2, seed=1, prefetch_bytes=cap
    )
    before = ds.source.storage.requests
    assert [_as_rows(b) for b in ds] == [_as_rows(b) for b in local]
    assert 0 < ds.prefetch_stats.peak_ahead <= cap  # fetches were read ahead, within the cap
    blocks = ROWS // 4
    assert ds.source.storage.requests - before <= 1.25 * blocks * 2  # data and indices
    with pytest.raises(ValueError, match=r"prefetch_bytes \(-1\) must be >= 0"):
        FetchDataset(url, Streaming(), 8, prefetch_bytes=-1)


def test_a_missing_object_fails_when_the_dataset_is_made_naming_the_url(s3_bucket: str):
    with pytest.raises(FileNotFoundError, match=rf"{s3_bucket}/absent\.h5ad does not exist"):
        FetchDataset(f"{s3_bucket}/absent.h5ad", Streaming(), batch_size=8)


def test_wrong_keys_fail_naming_the_url_and_never_the_secret(s3_bucket: str, files: dict[str, Any]):
    _, url, _ = files["npy"]
    wrong = {"key": "rankwise-wrong-key", "secret": "rankwise-wrong-secret-123"}
    with pytest.raises(StorageError, match="refused the credentials") as caught:
        FetchDataset(url, Streaming(), 8, storage_options=wrong, retry=RetryPolicy(attempts=1))
    assert url in str(caught.value) and "rankwise-wrong-secret-123" not in str(caught.value)


def test_a_store_that_never_answers_is_a_timeout_naming_the_url(s3_bucket: str, silent_endpoint):
    options = {"endpoint_url": silent_endpoint, "config_kwargs": {"read_timeout": 0.5}}
    started = time.monotonic()
    with (
        pytest.warns(StorageWarning, match="retrying in 0.1 s"),  # transient: retried first
        pytest.raises(StorageError, match=r"after 2 attempts.*ReadTimeout") as caught,
    ):
        FetchDataset(
            f"{s3_bucket}/x.npy",
            Streaming(),
            8,
            storage_options=options,
            retry=RetryPolicy(attempts=2, first_delay=0.1),
        )
    assert f"{s3_bucket}/x.npy" in str(caught.value)
    assert time.monotonic() - started < 20


def test_the_local_cache_holds_its_cap_and_serves_a_second_epoch(
    s3_bucket: str, files: dict[str, Any], tmp_path: Path
):
    path, url, _ = files["h5ad-csr"]
    local = FetchDataset(str(path), BlockShuffling(block_size=4), 8, fetch_factor=2, seed=1)
    total = local.source.nbytes(np.arange(ROWS))

    def epochs(cap: int) -> tuple[FetchDataset, list[int], list[Any]]:
        ds = FetchDataset(
            url,
            BlockShuffling(block_size=4),
            8,
            2,
            seed=1,
            cache_dir=tmp_path / f"c{cap}",
            cache_bytes=cap,
        )
        gets, batches = [], []
        for epoch in (0, 1):
            ds.set_epoch(epoch)
            local.set_epoch(epoch)
            before = ds.source.storage.requests
            batches.append([_as_rows(b) for b in ds])
            assert batches[-1] == [_as_rows(b) for b in local]  # the cache changes no row
            gets.append(ds.source.storage.requests - before)
            assert ds.cache is not None and ds.cache.held <= cap
            on_disk = sum(f.stat().st_size for f in ds.cache.folder.iterdir())
            assert on_disk == ds.cache.held
        return ds, gets, batches

    _, gets, _ = epochs(total)
    assert gets[0] > 0 and gets[1] == 0  # the whole file cached: epoch 1 reads from disk
    small, gets, _ = epochs(total // 3)
    assert small.cache is not None and small.cache.hits > 0 and 0 < gets[1] < gets[0]


def test_a_truncated_cache_file_is_not_served(
    s3_bucket: str, files: dict[str, Any], tmp_path: Path
):
    path, url, _ = files["h5ad-csr"]
    local = FetchDataset(str(path), BlockShuffling(block_size=4), 8, fetch_factor=2, seed=1)
    want = [_as_rows(b) for b in local]

    def dataset() -> FetchDataset:
        return FetchDataset(
            url,
            BlockShuffling(block_size=4),
            8,
            2,
            seed=1,
            cache_dir=tmp_path / "c",
            cache_bytes=1 << 20,
        )

    ds = dataset()
    assert [_as_rows(b) for b in ds] == want
    assert ds.cache is not None
    entries = sorted(ds.cache.folder.iterdir())
    cut, other = entries[0], entries[1]
    cut.write_bytes(cut.read_bytes()[:-3])  # a write a killed run left short
    before = ds.source.storage.requests
    assert [_as_rows(b) for b in ds] == want  # read again from the store, not the short file
    assert ds.source.storage.requests > before
    assert cut.stat().st_size == int(cut.name.split("-")[1]) - int(cut.name.split("-")[0])

    other.write_bytes(other.read_bytes()[:-1])
    again = dataset()
    assert [_as_rows(b) for b in again] == want  # a new run drops it at start-up
    assert again.source.storage.requests > 1


def test_a_rewritten_file_or_an_added_shard_is_never_served_from_the_old_cache(
    s3_bucket: str, tmp_path: Path
):
    store = Storage.for_url(s3_bucket)
    cache = {"cache_dir": tmp_path / "c", "cache_bytes": 1 << 20}

    def rows_of(source: str, **options: Any) -> list[Any]:
        ds = FetchDataset(source, BlockShuffling(block_size=4), 8, seed=1, **options)
        return [_as_rows(b) for b in ds]

    def put(name: str, rows: int, first: float) -> Path:
        path = tmp_path / name
        np.save(path, first + np.arange(rows * 3, dtype=np.float32).reshape(rows, 3))
        store.put(path, f"d/{name}")
        return path

    old = put("x.npy", 40, 0.0)
    assert rows_of(f"{s3_bucket}/d/x.npy", **cache) == rows_of(str(old))
    same = put("x.npy", 40, 500.0)  # the same key and size, other bytes: another ETag
    assert rows_of(f"{s3_bucket}/d/x.npy", **cache) == rows_of(str(same))
    new = put("x.npy", 52, 1000.0)  # the same key, other rows and size
    assert rows_of(f"{s3_bucket}/d/x.npy", **cache) == rows_of(str(new))
    assert len(list((tmp_path / "c").iterdir())) == 1  # the older versions' folders removed

    assert rows_of(f"{s3_bucket}/d/", **cache) == rows_of([str(new)])
    put("y.npy", 8, 5000.0)  # a shard added under the prefix
    local = [str(tmp_path / "x.npy"), str(tmp_path / "y.npy")]
    assert rows_of(f"{s3_bucket}/d/", **cache) == rows_of(local)


def test_a_parquet_fetch_reads_only_its_row_groups_column_chunks(
    s3_bucket: str, files: dict[str, Any]
):
    import pyarrow.parquet as pq

    path, url, _ = files["parquet"]
    ds = FetchDataset(url, Streaming(), 8, columns=["c0", "c1"])
    store = ds.source.storage
    assert store.requests == 1  # the footer, once
    before, bytes_before = store.requests, store.bytes_read
    rows = np.array([3, 4, 40])  # row groups 0 and 2 of 16 rows each
    got = ds.source[rows]
    want = pq.read_table(path).take(rows)
    assert got["c0"].tolist() == want["c0"].to_pylist() == [3, 4, 40]
    assert got["c1"].tolist() == want["c1"].to_pylist() and list(got.columns) == ["c0", "c1"]
    meta = pq.ParquetFile(path).metadata
    chunks = [meta.row_group(g).column(c).total_compressed_size for g in (0, 2) for c in (0, 1)]
    assert store.bytes_read - bytes_before == sum(chunks)  # c2.., name and group 1 unread
    assert store.requests - before == 2  # each group's two chunks lie side by side: one GET


def test_a_prefix_of_shards_reads_as_one_source_in_key_order(s3_bucket: str, files: dict[str, Any]):
    path, url, _ = files["shards"]
    ds = FetchDataset(url, Streaming(), 8)
    source, values = ds.source, np.load(path)
    assert source.shape == values.shape
    assert source.storage.requests == 3  # an .npy header per shard, through one client
    before = source.storage.requests
    rows = np.array([0, 39, 40, 41, 95])  # all three shards: part-1 holds row 40 alone
    assert source[rows].tolist() == values[rows].tolist()
    assert source.storage.requests - before == 5  # one GET per run of rows, in its shard
    assert [r[0] for b in ds for r in b.tolist()] == list(range(ROWS))
