"""scDataset guide, "Complete Training Example".

The guide's code with its imports changed, launched as the guide launches it:

    torchrun --nproc_per_node=2 examples/seeds/scdataset/complete_training.py

Lines marked "port:" are not the guide's:

- It reads ``large_dataset.h5ad`` from the working folder, which the guide does not provide:
  the port writes a small one there first when it is missing (2,000 cells x 160 genes,
  float32, column 0 holding the row id; every rank writes the same bytes to its own
  temporary name and renames it into place, so no rank reads a half-written file).
- ``backend="nccl"``, ``torch.cuda.set_device`` and ``.to(local_rank)`` need one GPU per
  rank: without CUDA the port uses gloo and the CPU.
- It prints, on every rank, the batches and the runs of rows read and a checksum of the
  model, for the test; prints are flushed so the two ranks' lines never interleave.
"""

import os

import anndata as ad
import numpy as np  # port
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from rankwise.compat.scdataset import BlockShuffling, scDataset
from rankwise.compat.scdataset.transforms import fetch_transform_adata

cuda = torch.cuda.is_available()  # port
if not os.path.exists("large_dataset.h5ad"):  # port: a small "large" data set
    x = np.random.default_rng(0).random((2000, 160), dtype=np.float32)  # port
    x[:, 0] = np.arange(2000) / 2000  # port: the row id (scaled, it is also a feature)
    tmp = f"large_dataset.{os.getpid()}.h5ad"  # port
    ad.AnnData(X=x).write_h5ad(tmp)  # port
    os.replace(tmp, "large_dataset.h5ad")  # port: atomic, whichever rank writes last


def runs(rows):  # port: [(first, last + 1), ...] of the sorted rows: a short line per rank
    rows = sorted(rows)
    starts = [i for i in range(len(rows)) if i == 0 or rows[i] != rows[i - 1] + 1]
    return [
        (rows[a], rows[b - 1] + 1) for a, b in zip(starts, [*starts[1:], len(rows)], strict=True)
    ]


def train():
    # Initialize distributed
    dist.init_process_group(backend="nccl" if cuda else "gloo")  # port: gloo without GPUs
    local_rank = int(os.environ["LOCAL_RANK"])
    if cuda:  # port
        torch.cuda.set_device(local_rank)
    device = local_rank if cuda else "cpu"  # port

    # Load data (each rank loads independently)
    adata = ad.read_h5ad("large_dataset.h5ad", backed="r")

    # Create dataset - DDP handled automatically
    dataset = scDataset(
        adata,
        BlockShuffling(block_size=256),
        batch_size=512,
        fetch_callback=lambda d, idx: fetch_transform_adata(d[idx]),
    )

    loader = DataLoader(dataset, batch_size=None, num_workers=4)

    # Model setup
    torch.manual_seed(0)  # port: the same initial model on every rank
    model = nn.Sequential(nn.Linear(adata.n_vars, 256), nn.ReLU(), nn.Linear(256, 128)).to(
        device
    )  # port: device
    model = DDP(model, device_ids=[local_rank] if cuda else None)  # port

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.MSELoss()

    # Training loop
    for epoch in range(10):
        dataset.set_epoch(epoch)  # Important for shuffling

        rows = []  # port
        for batch_idx, batch in enumerate(loader):
            batch = batch.to(device)  # port: device

            output = model(batch)
            loss = criterion(output, batch[:, :128])  # Reconstruction

            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            rows += (batch[:, 0] * 2000).round().long().tolist()  # port
            if batch_idx % 100 == 0 and local_rank == 0:
                print(
                    f"Epoch {epoch}, Batch {batch_idx}, Loss: {loss.item():.4f}", flush=True
                )  # port: flush
        print(
            f"rank {dist.get_rank()} epoch {epoch} batches {batch_idx + 1} rows {runs(rows)}",
            flush=True,
        )  # port

    checksum = sum(p.double().sum().item() for p in model.parameters())  # port
    print(f"rank {dist.get_rank()} parameter checksum {checksum!r}", flush=True)  # port
    dist.destroy_process_group()


if __name__ == "__main__":
    train()
