"""DPA guide, "Quick Start": basic distributed generation and range-based processing.

The guide's code with only its imports changed (``src.distributed`` / ``src.dpa`` ->
``rankwise.compat.dpa``). Run as the guide does, one plain process:

    python examples/seeds/dpa/quick_start.py
"""

# --- Basic Distributed Generation ---
from rankwise.compat.dpa import gen_distributed_augmentation_params, get_preset

config = get_preset("moderate")

# Generate parameters for rank 0 in a 4-rank setup
params = gen_distributed_augmentation_params(sample_id=42, rank=0, config=config, world_size=4)

print(f"Rotation: {params['rotation']:.2f}")
print(f"Brightness: {params['brightness']:.3f}")

# --- Range-Based Processing (uses the config above, as the guide's page does) ---
from rankwise.compat.dpa import (  # noqa: E402
    DistributedRangeSplitter,
    stream_distributed_augmentation_chain,
)

total_samples = 1000
world_size = 4
rank = 0

# Get this rank's sample range
splitter = DistributedRangeSplitter(total_samples, world_size)
start_id, end_id = splitter.get_rank_range(rank)

print(f"Rank {rank} processes samples {start_id} to {end_id - 1}")

# Stream parameters for this rank's range
param_stream = stream_distributed_augmentation_chain(
    num_samples=total_samples, rank=rank, world_size=world_size, config=config
)

for params in param_stream:  # noqa: B007
    # Process each parameter set
    pass

# Not in the guide: what the loop saw, for the test.
print(f"last sample streamed: {params['sample_id']}")
