"""scDataset guide, "Data Partitioning": the guide's comments, made to run.

    python examples/seeds/scdataset/partitioning.py

The guide's example is comments only ("With 1000 samples and world_size=4 ... Rank 0: samples
at positions 0, 4, 8, ..."). The port (every line "port:") builds the four ranks' datasets
with ``rank=`` / ``world_size=`` and prints what each holds. rankwise deals *fetches* of
``batch_size * fetch_factor`` positions round-robin, so the guide's index round-robin is the
case ``batch_size=1, fetch_factor=1``; the port also prints the default fetch sizes' split,
which keeps every rank at 250 rows in 2 batches of 128 (the released scdataset gives these
ranks 8, 0, 0 and 0 batches: one fetch of 2,048 rows holds them all; docs/seeds/scdataset.md).
"""

import numpy as np  # port

from rankwise.compat.scdataset import Streaming, scDataset

# Example: Understanding partitioning
# With 1000 samples and world_size=4:
# - Each rank processes ~250 samples
# - Rank 0: samples at positions 0, 4, 8, ... (250 samples)
# - Rank 1: samples at positions 1, 5, 9, ... (250 samples)
# etc.
samples = np.arange(1000)  # port
for rank in range(4):  # port
    ds = scDataset(
        samples, Streaming(), batch_size=1, fetch_factor=1, rank=rank, world_size=4
    )  # port
    positions = [int(b[0]) for b in ds]  # port: batches of one
    print(
        f"Rank {rank}: samples at positions {', '.join(map(str, positions[:3]))}, ... ({len(positions)} samples)"
    )  # port
for rank in range(4):  # port
    ds = scDataset(samples, Streaming(), batch_size=128, rank=rank, world_size=4)  # port
    print(
        f"batch_size=128, fetch_factor=16, rank {rank}: {len(ds)} batches, {sum(len(b) for b in ds)} samples"
    )  # port
