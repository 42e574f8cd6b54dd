"""``rankwise.data.dense_tensor``: fetched rows of any source as one dense tensor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rankwise.data import dense_tensor

X = np.arange(12, dtype=np.float64).reshape(4, 3) * (np.arange(12).reshape(4, 3) % 2)


def test_arrays_and_dtype() -> None:
    out = dense_tensor(X)
    assert out.dtype == torch.float32 and out.tolist() == X.tolist()
    assert dense_tensor(X, dtype=None).dtype == torch.float64  # None keeps the data's dtype


def test_anndata_in_memory_sparse_and_backed(tmp_path: Path) -> None:
    ad = pytest.importorskip("anndata")
    sparse = pytest.importorskip("scipy.sparse")
    h5py = pytest.importorskip("h5py")
    assert dense_tensor(ad.AnnData(X=sparse.csr_matrix(X))).tolist() == X.tolist()
    ad.AnnData(X=sparse.csr_matrix(X)).write_h5ad(tmp_path / "s.h5ad")
    backed = ad.read_h5ad(tmp_path / "s.h5ad", backed="r")
    assert dense_tensor(backed[np.array([0, 3])]).tolist() == X[[0, 3]].tolist()
    assert dense_tensor(backed.X).tolist() == X.tolist()  # anndata's backed sparse dataset
    backed.file.close()
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["x"] = X
        assert dense_tensor(f["x"]).tolist() == X.tolist()


def test_anndata_without_x_names_the_fix() -> None:
    ad = pytest.importorskip("anndata")
    with pytest.raises(ValueError, match="no X matrix; read a layer instead"):
        dense_tensor(ad.AnnData(obs={"a": [1, 2]}))
