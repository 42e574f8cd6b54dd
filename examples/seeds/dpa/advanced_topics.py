"""DPA guide, "Advanced Topics": custom seed generation and dynamic world size.

The guide's code with only its imports changed. Run as one plain process:

    python examples/seeds/dpa/advanced_topics.py
"""

from rankwise.compat.dpa import DistributedRangeSplitter, RankAwareSeedGenerator

# --- Custom Seed Generation ---
# Create custom seed generator
generator = RankAwareSeedGenerator(base_seed=42, world_size=8)

# Generate seeds for specific rank/sample combinations
seed = generator.generate_seed(sample_id=100, rank=3)
print(f"Seed for sample 100, rank 3: {seed}")

# Use with custom random number generator
import random  # noqa: E402

random.seed(int(seed, 16))  # Convert hex to int
custom_value = random.random()
print(f"custom value: {custom_value}")  # port: the guide computes it without printing


# --- Dynamic World Size ---
def handle_dynamic_scaling(current_samples, old_world_size, new_world_size):  # type: ignore[no-untyped-def]
    """Handle dynamic scaling of distributed training."""

    # Redistribute samples with new world size
    old_splitter = DistributedRangeSplitter(current_samples, old_world_size)  # noqa: F841
    new_splitter = DistributedRangeSplitter(current_samples, new_world_size)

    print("Redistribution plan:")
    for rank in range(new_world_size):
        start, end = new_splitter.get_rank_range(rank)
        if end > start:
            print(f"New rank {rank}: samples {start}-{end - 1}")
        else:
            print(f"New rank {rank}: no samples")

    return new_splitter


# Example: Scale from 4 to 6 ranks
new_splitter = handle_dynamic_scaling(current_samples=1000, old_world_size=4, new_world_size=6)
