"""Sources of several files and Parquet files, read in place from local paths (the same code
reads a bucket: tests/data/test_data_fetch_remote.py): a list of shards is one source in the
list's order, through the local cache as well; Parquet rows come back by column and as one
dense array; shards of Parquet join into one table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rankwise.data import BlockShuffling, FetchDataset, Streaming, dense_tensor


def _csr_shards(tmp_path: Path) -> tuple[list[str], np.ndarray]:
    anndata = pytest.importorskip("anndata")
    sparse = pytest.importorskip("scipy.sparse")
    values = np.arange(60, dtype=np.float32).reshape(20, 3) * (
        np.arange(60).reshape(20, 3) % 3 == 0
    )
    values[:, 0] = np.arange(20)  # row i's first value is i
    paths = []
    for name, (a, b) in {"b": (0, 12), "a": (12, 20)}.items():  # a list keeps its own order
        path = tmp_path / f"{name}.h5ad"
        anndata.AnnData(X=sparse.csr_matrix(values[a:b])).write_h5ad(path)
        paths.append(str(path))
    return paths, values


def test_a_list_of_shards_is_one_source_also_through_the_cache(tmp_path: Path) -> None:
    paths, values = _csr_shards(tmp_path)
    ds = FetchDataset(
        paths,
        BlockShuffling(block_size=2),
        4,
        2,
        seed=5,
        cache_dir=tmp_path / "c",
        cache_bytes=1 << 20,
    )
    rows = np.array([2, 11, 12, 19])  # both shards
    assert dense_tensor(ds.source[rows]).tolist() == values[rows].tolist()
    assert ds.source[rows].obs_names.tolist() == ["2", "11", "0", "7"]  # each shard's own obs
    firsts = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        before = ds.source.requests
        firsts.append(sorted(int(r[0]) for b in ds for r in dense_tensor(b).tolist()))
        if epoch:
            assert ds.source.requests == before  # the whole epoch from the cache
    assert firsts == [list(range(20))] * 2


def _parquet(path: Path, first: int, rows: int) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    ids = np.arange(first, first + rows)
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 2).astype("float32")), 2)
    table = pa.table({"id": ids, "v": vectors, "name": [f"r{i}" for i in ids]})
    pq.write_table(table, path, row_group_size=5)


def test_parquet_rows_by_column_and_as_one_array_and_as_shards(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    _parquet(tmp_path / "s" / "p0.parquet", 0, 12)
    _parquet(tmp_path / "s" / "p1.parquet", 12, 9)
    one = FetchDataset(str(tmp_path / "s" / "p0.parquet"), Streaming(), 4, columns=["id", "v"])
    rows = one.source[np.array([1, 6, 11])]
    assert rows["id"].tolist() == [1, 6, 11] and rows["v"].shape == (3, 2)
    assert dense_tensor(rows[np.array([2, 0])]).tolist() == [[11, 11, 11], [1, 1, 1]]
    assert rows.to_pandas()["id"].tolist() == [1, 6, 11]
    shards = FetchDataset(f"{tmp_path / 's'}/", BlockShuffling(block_size=2), 4, 2, seed=1)
    assert shards.source.shape == (21, 3)
    seen = [(int(i), str(n)) for b in shards for i, n in zip(b["id"], b["name"], strict=True)]
    assert sorted(seen) == [(i, f"r{i}") for i in range(21)]


def test_h5ad_shards_of_other_genes_or_gene_order_are_refused(tmp_path: Path) -> None:
    anndata = pytest.importorskip("anndata")
    import pandas as pd

    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    genes = {"a": ["g1", "g2", "g3"], "b": ["g2", "g1", "g3"], "c": ["g1", "g2", "g4"]}
    for name, names in genes.items():
        var = pd.DataFrame(index=names)
        anndata.AnnData(X=values, var=var).write_h5ad(tmp_path / f"{name}.h5ad")
    same = FetchDataset([str(tmp_path / "a.h5ad")] * 2, Streaming(), 4)
    assert same.source.shape == (8, 3)
    for other in ("b", "c"):  # the same genes in another order; another gene
        with pytest.raises(ValueError, match=rf"shard .*{other}\.h5ad does not match .*a\.h5ad"):
            FetchDataset(
                [str(tmp_path / "a.h5ad"), str(tmp_path / f"{other}.h5ad")], Streaming(), 4
            )


def test_a_pickled_source_of_shards_keeps_one_storage_per_folder(tmp_path: Path) -> None:
    import pickle

    paths, values = _csr_shards(tmp_path)
    source = FetchDataset(paths, Streaming(), 4).source
    assert len({id(shard.storage) for shard in source.shards}) == 1
    copy = pickle.loads(pickle.dumps(source))  # a spawned worker's
    assert len({id(shard.storage) for shard in copy.shards}) == 1
    assert copy.storage is copy.shards[1].storage
    rows = np.array([2, 11, 12, 19])
    assert dense_tensor(copy[rows]).tolist() == values[rows].tolist()


def test_prefetch_threads_make_one_storage_and_a_pickle_carries_no_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle
    import threading
    import time

    from rankwise.data.range_source import RangeSource
    from rankwise.storage import Storage

    made = Storage.for_url

    def slow(*args: object, **kwargs: object) -> Storage:
        time.sleep(0.05)  # a remote client takes this long to make: the threads overlap
        return made(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Storage, "for_url", slow)
    source = RangeSource(str(tmp_path / "x.npy"))
    gate, got = threading.Barrier(8), []

    def first_read() -> None:
        gate.wait()
        got.append(source.storage)

    threads = [threading.Thread(target=first_read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(s) for s in got}) == 1
    copy = pickle.loads(pickle.dumps(source))
    assert copy._storage is None and copy.storage is copy.storage
