"""DPA guide, "Best Practices": consistent configuration, error handling, streaming, validation.

The guide's code with only its imports changed. Its snippets use ``rank``, ``world_size``
and ``sample_id`` from the surrounding script; the port sets them for one rank of a 4-rank
job (the lines marked "port:"). Run as one plain process:

    python examples/seeds/dpa/best_practices.py
"""

from rankwise.compat.dpa import (
    DistributedRangeSplitter,
    gen_distributed_augmentation_params,
    get_preset,
    stream_distributed_augmentation_chain,
)

rank, world_size, sample_id = 1, 4, 7  # port: the guide's snippets take these from context

# --- 1. Consistent Configuration ---
# ✓ Good: Same config for all ranks
config = get_preset("moderate")

# --- 2. Proper Error Handling ---
try:
    params = gen_distributed_augmentation_params(
        sample_id=sample_id, rank=rank, config=config, world_size=world_size
    )
except ValueError as e:
    print(f"Invalid parameters: {e}")
    # Handle error appropriately
print(f"sample {sample_id} on rank {rank}: rotation={params['rotation']:.2f}")

# --- 3. Memory Management ---
# ✓ Good: Streaming for large datasets
param_stream = stream_distributed_augmentation_chain(
    num_samples=1000000,  # Large dataset
    rank=rank,
    world_size=world_size,
    config=config,
    chunk_size=1000,  # Process in chunks
)
# Not in the guide: take the first few, to show the stream starts at this rank's range.
print(f"first streamed sample: {next(param_stream)['sample_id']}")


# --- 4. Validation ---
def validate_distributed_setup(total_samples, world_size):  # type: ignore[no-untyped-def]
    """Validate distributed training setup."""
    splitter = DistributedRangeSplitter(total_samples, world_size)

    # Check ranges are valid
    if not splitter.validate_ranges():
        raise ValueError("Invalid range configuration")

    # Check all samples are covered
    all_ranges = splitter.get_all_ranges()
    total_assigned = sum(end - start for start, end in all_ranges)

    if total_assigned != total_samples:
        raise ValueError(f"Sample count mismatch: {total_assigned} != {total_samples}")

    print(f"✓ Distributed setup validated: {total_samples} samples, {world_size} ranks")


# Use before starting training
validate_distributed_setup(total_samples=10000, world_size=8)
