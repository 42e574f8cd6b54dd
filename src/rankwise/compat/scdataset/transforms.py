"""``scdataset.transforms`` on rankwise: ``fetch_transform_adata`` is
:func:`rankwise.data.dense_tensor`, a fetched (backed) AnnData slice as a dense float32 tensor.

>>> import anndata, numpy as np
>>> adata = anndata.AnnData(X=np.ones((4, 3), dtype=np.float32))
>>> fetch_transform_adata(adata[np.array([0, 2])]).shape
torch.Size([2, 3])
"""

from rankwise.data import dense_tensor as fetch_transform_adata

__all__ = ["fetch_transform_adata"]
