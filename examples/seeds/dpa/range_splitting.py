"""DPA guide, "Range Splitting": basic usage, uneven distribution and validation.

The guide's code with only its imports changed. Run as one plain process:

    python examples/seeds/dpa/range_splitting.py
"""

from rankwise.compat.dpa import DistributedRangeSplitter

# --- Basic Usage: split 100 samples across 4 ranks ---
splitter = DistributedRangeSplitter(total_samples=100, world_size=4)

for rank in range(4):
    start, end = splitter.get_rank_range(rank)
    samples_count = end - start
    print(f"Rank {rank}: samples {start}-{end - 1} ({samples_count} samples)")

# --- Handling Uneven Distribution: 23 samples across 4 ranks ---
splitter = DistributedRangeSplitter(total_samples=23, world_size=4)

for rank in range(4):
    start, end = splitter.get_rank_range(rank)
    if end > start:
        print(f"Rank {rank}: samples {start}-{end - 1} ({end - start} samples)")
    else:
        print(f"Rank {rank}: no samples assigned")

# --- Validation ---
# Verify ranges are valid
is_valid = splitter.validate_ranges()
print(f"Ranges valid: {is_valid}")

# Get all ranges at once
all_ranges = splitter.get_all_ranges()
print(f"All ranges: {all_ranges}")
