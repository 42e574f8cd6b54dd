"""CyxWiz guide, "Python API Reference": DistributedSampler and DistributedBatchIterator, and
"Best Practices" 1 (Always Set Epoch in Sampler) and 5 (Handle Uneven Data Sizes).

    scripts/launch_distributed.sh 2 python examples/seeds/cyxwiz/sampler.py

The guide's code with its import changed; the port defines what the snippets leave undefined
(``epoch``, ``num_epochs``, ``dataset``) and prints what the test checks (lines marked "port:"); this rank's 5000 indices go to ``indices_rank<R>.json`` in the current
folder.
The sampler takes its rank and world size from ``cx.distributed.init()``'s process group.
"""

import json  # port

import rankwise.compat.cyxwiz as cx

cx.distributed.init()  # port: who this process is
rank = cx.distributed.get_rank()  # port
epoch = 0  # port
num_epochs = 2  # port
dataset = list(range(10))  # port: 10 samples, so 2 ranks with drop_last get 5 each

# Create sampler
sampler = cx.distributed.DistributedSampler(
    dataset_size=10000, shuffle=True, seed=42, drop_last=False
)

# Per-epoch methods
sampler.set_epoch(epoch)  # IMPORTANT: call at start of each epoch
indices = sampler.get_indices()  # Get this rank's indices

# Info methods
sampler.local_size()  # Samples for this rank
sampler.total_size()  # Total dataset size
sampler.padded_size()  # Padded size (divisible by world_size)
print(
    f"rank {rank}: sizes {sampler.local_size()} {sampler.total_size()} {sampler.padded_size()}",
    flush=True,
)  # port
with open(f"indices_rank{rank}.json", "w") as f:  # port: too long to print (5000 indices)
    json.dump(indices, f)

# --- DistributedBatchIterator ---
# Create iterator
batch_iter = cx.distributed.DistributedBatchIterator(sampler, batch_size=64)

# Iterate
seen = []  # port
while batch_iter.has_next():
    indices = batch_iter.next()  # -> list of indices
    # Use indices to get batch from dataset
    seen.append(len(indices))  # port

# Reset for new epoch
batch_iter.reset(epoch=1)

# Info
batch_iter.num_batches()  # Total batches per epoch
print(
    f"rank {rank}: batches {len(seen)} last {seen[-1]} num_batches {batch_iter.num_batches()}"
)  # port

# --- Best practice 1: Always Set Epoch in Sampler ---
for epoch in range(num_epochs):
    sampler.set_epoch(epoch)  # Ensures different shuffling each epoch
    # ... training loop
    print(f"rank {rank}: epoch {epoch} first {sampler.get_indices()[:5]}")  # port

# --- Best practice 5: Handle Uneven Data Sizes ---
# Use drop_last=True for consistent batch sizes
sampler = cx.distributed.DistributedSampler(
    dataset_size=len(dataset),
    drop_last=True,  # Ensures all ranks have same number of batches
)
print(f"rank {rank}: drop_last {sampler.get_indices()} padded {sampler.padded_size()}")  # port
cx.distributed.finalize()  # port
