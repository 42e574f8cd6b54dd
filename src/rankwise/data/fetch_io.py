"""Reading rows of a FetchDataset's source: one sorted call per fetch.

>>> default_fetch(np.arange(10) * 10, np.array([2, 3, 7])).tolist()
[20, 30, 70]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["default_fetch", "dense_tensor", "probe_default_fetch", "source_len"]

IntArray = npt.NDArray[np.int64]


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


def probe_default_fetch(source: Any) -> None:
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


def source_len(source: Any) -> int:
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


def dense_tensor(data: Any, dtype: torch.dtype | None = torch.float32) -> torch.Tensor:
    """Fetched rows as one dense tensor: an AnnData (backed or not, a view or not) gives its
    ``X``; a scipy sparse matrix, an h5py dataset, an anndata backed sparse dataset or an
    array gives its values. ``dtype`` (float32 by default, what ``nn.Linear`` takes; None
    keeps the data's own) is applied in the same copy.

    >>> dense_tensor(np.eye(2, dtype=np.float64))
    tensor([[1., 0.],
            [0., 1.]])
    """
    x = data.X if _is_anndata(data) else data
    if x is None:
        raise ValueError(
            "the AnnData has no X matrix; read a layer instead, e.g. "
            "fetch_callback=lambda a, idx: dense_tensor(a[idx].layers['counts'])."
        )
    if callable(getattr(x, "to_memory", None)):  # anndata's backed sparse dataset
        x = x.to_memory()
    if callable(getattr(x, "toarray", None)):  # scipy sparse
        x = x.toarray()
    return torch.as_tensor(np.asarray(x), dtype=dtype)


def _is_anndata(data: Any) -> bool:
    return any(c.__name__ == "AnnData" for c in type(data).__mro__) and hasattr(data, "X")
