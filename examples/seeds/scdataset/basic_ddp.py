"""scDataset guide, "Basic DDP Setup".

The guide's code with its imports changed, launched as the guide launches it:

    torchrun --nproc_per_node=2 examples/seeds/scdataset/basic_ddp.py

Lines marked "port:" are not the guide's:

- It leaves ``load_adata``, ``my_fetch_fn``, ``YourModel`` and ``num_epochs`` undefined: the
  port writes a tiny backed .h5ad (1,000 cells x 16 genes, column 0 holding the row id; path
  from SCDATASET_EXAMPLE_DIR, else the temporary folder, where rank 0 deletes it after a
  final barrier), reads rows as a dense tensor, uses a linear model and runs 3 epochs.
- ``backend="nccl"``, ``torch.cuda.set_device`` and ``device_ids=[local_rank]`` need one GPU
  per rank: without CUDA the port uses gloo and the CPU.
- Its training code is ``pass``; the port takes one DDP step per batch (DDP all-reduces the
  gradients, so a rank with one batch more than the others would hang here) and prints what
  each rank read, for the test.
"""

import os
import tempfile  # port

import anndata as ad  # port
import numpy as np  # port
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from rankwise.compat.scdataset import BlockShuffling, scDataset

# port: ---- the guide's undefined names ---------------------------------------------------
cuda = torch.cuda.is_available()  # port
num_epochs = 3  # port
N_CELLS, N_GENES = 1000, 16  # port


def adata_path():  # port
    folder = os.environ.get("SCDATASET_EXAMPLE_DIR") or tempfile.gettempdir()
    return os.path.join(folder, f"scdataset_basic_{os.environ['MASTER_PORT']}.h5ad")


def load_adata():  # port: a tiny backed .h5ad, written once by rank 0
    path = adata_path()
    if dist.get_rank() == 0:
        x = np.random.default_rng(0).random((N_CELLS, N_GENES), dtype=np.float32)
        x[:, 0] = np.arange(N_CELLS)  # the row id, so the test can see who read what
        ad.AnnData(X=x).write_h5ad(path)
    dist.barrier()
    return ad.read_h5ad(path, backed="r")


def my_fetch_fn(adata, idx):  # port: the fetched rows as one dense tensor
    return torch.as_tensor(adata[idx].X)


def remove_adata():  # port: no file left in the temporary folder once every rank is done
    dist.barrier()
    if dist.get_rank() == 0 and not os.environ.get("SCDATASET_EXAMPLE_DIR"):
        os.remove(adata_path())


def YourModel():  # port
    torch.manual_seed(0)
    return torch.nn.Linear(N_GENES, 1)


# port: ---- end ---------------------------------------------------------------------------


def setup_distributed():
    """Initialize distributed training."""
    dist.init_process_group(backend="nccl" if cuda else "gloo")  # port: gloo without GPUs
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    return rank, world_size


def main():
    rank, world_size = setup_distributed()
    local_rank = int(os.environ["LOCAL_RANK"])
    if cuda:  # port
        torch.cuda.set_device(local_rank)
    device = local_rank if cuda else "cpu"  # port

    # Load your data source
    adata = load_adata()  # Your data loading function

    # Create scDataset - it automatically detects rank and world_size
    dataset = scDataset(
        adata, BlockShuffling(block_size=64), batch_size=128, fetch_callback=my_fetch_fn
    )

    # Create DataLoader (no DistributedSampler needed!)
    loader = DataLoader(
        dataset,
        batch_size=None,  # Batching handled by scDataset
        num_workers=2,
    )

    # Standard DDP model setup
    model = YourModel().to(device)  # port: device, not local_rank, without GPUs
    model = DDP(model, device_ids=[local_rank] if cuda else None)  # port

    for epoch in range(num_epochs):
        # IMPORTANT: Call set_epoch for proper shuffling
        dataset.set_epoch(epoch)

        rows, batches = [], 0  # port
        for batch in loader:
            batch = batch.to(device)  # port: device
            # Training code here
            model(batch).pow(2).mean().backward()  # port: one DDP step (all-reduce)
            rows, batches = rows + batch[:, 0].long().tolist(), batches + 1  # port
        print(
            f"rank {rank}/{world_size} epoch {epoch} batches {batches} rows {rows}", flush=True
        )  # port: one write, one line

    remove_adata()  # port
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
