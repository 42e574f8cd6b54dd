"""scDataset guide, "Manual Rank Configuration": rank and world size given, no process group.

    python examples/seeds/scdataset/manual_rank.py

Lines marked "port:" are not the guide's: it leaves ``adata`` and ``my_fetch_fn`` undefined
(the port makes 1,000 cells x 8 genes in memory, column 0 holding the row id, and reads rows
as a dense tensor), and prints what rank 2 of 4 reads.
"""

import anndata as ad  # port
import numpy as np  # port
import torch  # port

from rankwise.compat.scdataset import BlockShuffling, scDataset

x = np.random.default_rng(0).random((1000, 8), dtype=np.float32)  # port
x[:, 0] = np.arange(1000)  # port: the row id
adata = ad.AnnData(X=x)  # port


def my_fetch_fn(adata, idx):  # port
    return torch.as_tensor(adata[idx].X)


# Explicit rank configuration
dataset = scDataset(
    adata,
    BlockShuffling(block_size=64),
    batch_size=128,
    fetch_callback=my_fetch_fn,
    rank=2,  # This worker's rank (0-indexed)
    world_size=4,  # Total number of workers
)

batches = list(dataset)  # port
rows = [int(r) for b in batches for r in b[:, 0]]  # port
print(
    f"rank {dataset.rank} of {dataset.world_size}: {len(dataset)} batches, {len(rows)} rows"
)  # port
print(f"rows {rows}")  # port
