"""docs/troubleshooting.md's rows for the lower layers (rankwise.distributed, data, parallel)
added after tests/troubleshooting/test_troubleshooting.py's first set, each provoked in this process.
tests/troubleshooting/test_troubleshooting.py checks that these rows and triggers pair up."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch import nn
from torch.utils.data import DataLoader

import rankwise.data as rdata
import rankwise.parallel as rp
from helpers.troubleshooting_table import check_row, raised, warned
from rankwise.distributed import DistributedConfig


def _sampler_repeats_an_epoch() -> BaseException:
    sampler = rdata.DistributedSampler(8, num_replicas=2, rank=0)
    list(sampler)
    return warned(list, sampler)


def _fetch_state_other_source() -> BaseException:
    kw = {"strategy": rdata.Streaming(), "batch_size": 2, "rank": 0, "world_size": 1}
    state = rdata.FetchDataset(np.zeros((10, 2)), **kw).state_dict()
    return raised(rdata.FetchDataset(np.zeros((12, 2)), **kw).load_state_dict, state)


# -- FetchDataset ------------------------------------------------------------------------------

_KW: dict[str, Any] = {"batch_size": 2, "rank": 0, "world_size": 1}


def _fetch(rows: int = 10, strategy: Any = None, **kw: Any) -> rdata.FetchDataset:
    return rdata.FetchDataset(np.zeros((rows, 2)), strategy or rdata.Streaming(), **{**_KW, **kw})


def _state(**changes: Any) -> dict[str, Any]:
    ds = _fetch()
    list(ds)
    ds.advance(2)  # 4 of 10 rows consumed
    return {**ds.state_dict(), **changes}


def _load_state(state: dict[str, Any], ds: rdata.FetchDataset | None = None) -> BaseException:
    return raised((ds or _fetch()).load_state_dict, state)


def _fetch_advanced_never_iterated() -> BaseException:
    ds = _fetch()
    ds.advance(1)  # advanced by batches of another loader: nothing was read from this one
    return raised(ds.state_dict)


def _fetch_epoch_repeated() -> BaseException:
    ds = _fetch()
    list(ds)
    ds.advance(len(ds))
    return warned(list, ds)  # the next epoch, without set_epoch


def _fetch_drop_last_tail() -> BaseException:
    ds = _fetch(rows=10)  # batches of 2
    list(ds)
    ds.advance(4)  # 2 rows left
    resumed = _fetch(rows=10, batch_size=4, drop_last=True)  # resumed with larger batches
    resumed.load_state_dict(ds.state_dict())
    return warned(list, resumed)


def _fetch_persistent_workers() -> BaseException:
    ds = _fetch(rows=40)
    loader = DataLoader(ds, batch_size=None, num_workers=1, persistent_workers=True)
    for _ in loader:  # the first epoch: the worker keeps its copy of the dataset
        pass
    other = _fetch(rows=40)
    list(other)
    other.advance(3)
    ds.load_state_dict(other.state_dict())  # after the workers copied the dataset
    # torch re-raises it as "Caught RuntimeError in DataLoader worker process 0." with the
    # worker's traceback; its last line is the error the row documents.
    last = str(raised(list, loader)).strip().splitlines()[-1]
    kind, _, message = last.partition(": ")
    return type(kind, (Exception,), {})(message)


def _anndata_without_x() -> BaseException:
    import anndata
    import pandas as pd

    adata = anndata.AnnData(obs=pd.DataFrame(index=[f"cell{i}" for i in range(4)]))
    return raised(rdata.dense_tensor, adata[:2])


# -- samplers ----------------------------------------------------------------------------------


def _sampler(n: int = 10) -> rdata.DistributedSampler:
    return rdata.DistributedSampler(n, num_replicas=2, rank=0)


def _sampler_iterator_exhausted() -> BaseException:
    sampler = _sampler()
    state = sampler.state_dict()
    it = iter(sampler)
    list(it)
    return raised(it.load_state_dict, state)


# -- weighted strategies -----------------------------------------------------------------------


def _weighted_epoch(strategy: Any, rows: int = 10) -> BaseException:
    return raised(_fetch, rows, strategy)


# -- sources read in place (a path or URL) -----------------------------------------------------


def _file_source(
    name: str, write: Callable[[Path], None] | None = None, **kw: Any
) -> BaseException:
    path = Path(tempfile.mkdtemp(prefix="rankwise-ts-")) / name
    if write is not None:
        write(path)
    return raised(rdata.FetchDataset, str(path), rdata.Streaming(), 2, **kw)


def _fetch_cache_no_version() -> BaseException:
    """A source whose store gave no version tag (as an fsspec backend with no ETag would)."""
    from rankwise.data.sources import open_source

    folder = Path(tempfile.mkdtemp(prefix="rankwise-ts-"))
    np.save(folder / "x.npy", np.zeros((4, 2)))
    source = open_source(str(folder / "x.npy"))
    source.file_version = None
    kw = {"cache_dir": str(folder / "cache"), "cache_bytes": 1 << 20}
    return warned(rdata.FetchDataset, source, rdata.Streaming(), 2, **kw)


def _h5(path: Path, **options: Any) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("x" if options else "features", data=np.zeros((8, 2)), **options)


def _csc_h5ad(path: Path) -> None:
    import anndata
    import scipy.sparse

    anndata.AnnData(X=scipy.sparse.csc_matrix(np.eye(4, dtype=np.float32))).write_h5ad(path)


def _parquet(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": np.arange(4), "name": list("wxyz")}), path)


def _parquet_not_numeric() -> BaseException:
    folder = Path(tempfile.mkdtemp(prefix="rankwise-ts-"))
    _parquet(folder / "t.parquet")
    ds = rdata.FetchDataset(str(folder / "t.parquet"), rdata.Streaming(), 2)
    return raised(rdata.dense_tensor, next(iter(ds)))


def _shards(*files: tuple[str, Any]) -> BaseException:
    folder = Path(tempfile.mkdtemp(prefix="rankwise-ts-"))
    for name, rows in files:
        if isinstance(rows, bytes):
            (folder / name).write_bytes(rows)
        else:
            np.save(folder / name, rows)
    return raised(rdata.FetchDataset, f"{folder}/", rdata.Streaming(), 2)


def _without_pyarrow() -> BaseException:
    # As where pyarrow is not installed: an import of a module set to None in sys.modules fails.
    saved = {m: sys.modules.pop(m) for m in list(sys.modules) if m.split(".")[0] == "pyarrow"}
    sys.modules["pyarrow"] = None  # type: ignore[assignment]
    try:
        return raised(rdata.FetchDataset, "s3://bucket/cells.parquet", rdata.Streaming(), 2)
    finally:
        del sys.modules["pyarrow"]
        sys.modules.update(saved)


TRIGGERS: dict[str, Callable[[], BaseException]] = {
    "fetch-package-missing": _without_pyarrow,
    "fetch-parquet-no-column": lambda: _file_source("t.parquet", _parquet, columns=["b"]),
    "fetch-parquet-not-parquet": lambda: _file_source(
        "t.parquet", lambda p: p.write_bytes(b"a,b\n1,2\n")
    ),
    "fetch-parquet-not-numeric": _parquet_not_numeric,
    "fetch-columns-not-parquet": lambda: _file_source(
        "p.npy", lambda p: np.save(p, np.zeros(4)), columns=["a"]
    ),
    "fetch-shards-none": lambda: _shards(),
    "fetch-shards-mixed": lambda: _shards(("a.npy", np.zeros(2)), ("b.csv", b"1\n")),
    "fetch-shards-differ": lambda: _shards(("a.npy", np.zeros((2, 3))), ("b.npy", np.zeros(2))),
    "fetch-url-suffix": lambda: raised(rdata.FetchDataset, "cells.csv", rdata.Streaming(), 2),
    "fetch-url-missing": lambda: _file_source("absent.npy"),
    "fetch-url-h5-no-dataset": lambda: raised(
        rdata.FetchDataset, "features.h5", rdata.Streaming(), 2
    ),
    "fetch-url-no-such-dataset": lambda: _file_source("f.h5", _h5, dataset="feats"),
    "fetch-url-h5ad-dataset": lambda: raised(
        rdata.FetchDataset, "cells.h5ad", rdata.Streaming(), 2, dataset="X"
    ),
    "fetch-url-compressed": lambda: _file_source(
        "z.h5", lambda p: _h5(p, compression="gzip"), dataset="x"
    ),
    "fetch-url-x-encoding": lambda: _file_source("csc.h5ad", _csc_h5ad),
    "fetch-url-fortran": lambda: _file_source(
        "f.npy", lambda p: np.save(p, np.asfortranarray(np.zeros((4, 3))))
    ),
    "fetch-url-options-for-object": lambda: raised(
        rdata.FetchDataset, np.zeros(4), rdata.Streaming(), 2, storage_options={}
    ),
    "fetch-cache-for-object": lambda: raised(
        rdata.FetchDataset, np.zeros(4), rdata.Streaming(), 2, cache_dir="cache"
    ),
    "fetch-cache-no-version": _fetch_cache_no_version,
    "fetch-prefetch-negative": lambda: _file_source(
        "p.npy", lambda p: np.save(p, np.zeros(4)), prefetch_bytes=-1
    ),
    "world-size-zero": lambda: raised(DistributedConfig, rank=0, world_size=0),
    "rank-negative": lambda: raised(DistributedConfig, rank=-1, world_size=2),
    "sampler-dataset-type": lambda: raised(rdata.DistributedSampler, iter(range(4))),
    "sampler-no-set-epoch": _sampler_repeats_an_epoch,
    "fetch-state-other-source": _fetch_state_other_source,
    "wrap-strategy-unknown": lambda: raised(rp.wrap_model, nn.Linear(2, 2), strategy="zero"),
    "check-not-integer": lambda: raised(rdata.DistributedSampler, 10, num_replicas=2, rank=1.0),
    "check-epoch-too-large": lambda: raised(_sampler().set_epoch, 2**63),
    "fetch-strategy-type": lambda: raised(
        rdata.FetchDataset, np.zeros((10, 2)), "blocks", batch_size=2
    ),
    "fetch-advance-past-end": lambda: raised(_fetch().advance, 6),
    "fetch-advance-not-iterated": _fetch_advanced_never_iterated,
    "fetch-state-from-worker": lambda: _load_state({"in_worker": True}),
    "fetch-epoch-repeated": _fetch_epoch_repeated,
    "fetch-drop-last-tail": _fetch_drop_last_tail,
    "fetch-persistent-workers": _fetch_persistent_workers,
    "fetch-source-not-indexable": lambda: raised(
        rdata.FetchDataset, [[0.0, 0.0]] * 10, rdata.Streaming(), **_KW
    ),
    "fetch-source-no-len": lambda: raised(
        rdata.FetchDataset, (row for row in np.zeros((10, 2))), rdata.Streaming(), **_KW
    ),
    "fetch-anndata-no-x": _anndata_without_x,
    "fetch-state-missing": lambda: _load_state({"epoch": 0}),
    "fetch-state-version": lambda: _load_state(_state(version=99)),
    "fetch-state-other-strategy": lambda: _load_state(
        _state(), _fetch(strategy=rdata.BlockShuffling(indices=np.arange(8)))
    ),
    "fetch-state-not-list": lambda: _load_state(_state(pieces="[]")),
    "fetch-state-piece-shape": lambda: _load_state(_state(pieces=[[4, 6]])),
    "fetch-state-piece-order": lambda: _load_state(_state(pieces=[[6, 4, 0, 2]])),
    "sampler-iterator-exhausted": _sampler_iterator_exhausted,
    "sampler-data-twice": lambda: raised(
        rdata.DistributedSampler, range(10), num_replicas=2, rank=0, dataset_size=10
    ),
    "sampler-advance-past-end": lambda: raised(_sampler().advance, 6),
    "sampler-state-consumed": lambda: raised(
        _sampler().load_state_dict, {**_sampler().state_dict(), "consumed": 12}
    ),
    "permutation-size": lambda: raised(rdata.Permutation, 2**62),
    "permutation-positions": lambda: raised(rdata.Permutation(10).__getitem__, np.arange(8, 12)),
    "permutation-step": lambda: raised(rdata.Permutation(10).take, 0, 10, 0),
    "indices-shape": lambda: raised(rdata.BlockShuffling, indices=np.zeros((2, 5), np.int64)),
    "indices-negative": lambda: raised(rdata.BlockShuffling, indices=[-1, 0, 1]),
    "indices-beyond-source": lambda: raised(
        _fetch, 10, rdata.BlockShuffling(indices=np.arange(5, 12))
    ),
    "block-size-type": lambda: raised(rdata.BlockShuffling, block_size=2.5),
    "class-labels-shape": lambda: raised(rdata.ClassBalancedSampling, labels=[]),
    "weighted-no-sampling-size": lambda: raised(
        rdata.BlockWeightedSampling, weights=np.ones(10), replace=False
    ),
    "weighted-sampling-size-ignored": lambda: warned(
        rdata.BlockWeightedSampling, weights=np.ones(10), sampling_size=5
    ),
    "weighted-no-rows": lambda: _weighted_epoch(
        rdata.BlockWeightedSampling(indices=np.array([], np.int64), total_size=8)
    ),
    "weighted-too-few-positive": lambda: _weighted_epoch(
        rdata.BlockWeightedSampling(weights=[1.0, 1.0] + [0.0] * 8, replace=False, sampling_size=4)
    ),
    "weighted-length": lambda: _weighted_epoch(rdata.BlockWeightedSampling(weights=np.ones(8))),
    "weighted-subset-zero": lambda: _weighted_epoch(
        rdata.BlockWeightedSampling(indices=[0, 1], weights=[0.0, 0.0] + [1.0] * 8)
    ),
    "class-labels-fewer-than-indices": lambda: raised(
        rdata.ClassBalancedSampling, labels=[0, 1, 1], indices=np.arange(5)
    ),
    "class-labels-length": lambda: _weighted_epoch(
        rdata.ClassBalancedSampling(labels=[0, 1, 1, 0, 1, 0, 1, 1])
    ),
    "weights-shape": lambda: raised(rdata.BlockWeightedSampling, weights=np.ones((10, 1))),
    "weights-negative": lambda: raised(
        rdata.BlockWeightedSampling, weights=[1.0, -0.5, float("nan"), 1.0]
    ),
    "weights-zero": lambda: raised(rdata.BlockWeightedSampling, weights=np.zeros(10)),
}


@pytest.mark.parametrize("row_id", sorted(TRIGGERS))
def test_documented_message_is_the_one_raised(row_id: str) -> None:
    check_row(row_id, TRIGGERS[row_id])
