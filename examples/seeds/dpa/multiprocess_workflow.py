"""DPA guide, "Multi-Process Coordination": the complete distributed workflow.

The guide's code with only its imports changed; it starts its own 4 worker processes with
``multiprocessing``, so it runs as one plain process:

    python examples/seeds/dpa/multiprocess_workflow.py

The guide's worker uses ``AugmentationConfig`` without importing it (its page imports only
``stream_distributed_augmentation_chain`` and ``get_preset``); the port imports it too.
"""

import multiprocessing as mp

from rankwise.compat.dpa import (
    AugmentationConfig,
    get_preset,
    stream_distributed_augmentation_chain,
)


def worker_process(rank, world_size, total_samples, config_dict, results_queue):  # type: ignore[no-untyped-def]
    """Worker process for distributed training simulation."""
    # Reconstruct config from dictionary
    config = AugmentationConfig(**config_dict)

    # Process this rank's samples
    processed_count = 0
    param_stream = stream_distributed_augmentation_chain(
        num_samples=total_samples, rank=rank, world_size=world_size, config=config
    )

    for params in param_stream:  # noqa: B007
        # Simulate processing
        processed_count += 1

    results_queue.put({"rank": rank, "processed": processed_count})


# Main process coordination
def run_distributed_training():  # type: ignore[no-untyped-def]
    world_size = 4
    total_samples = 1000
    config = get_preset("moderate")

    # Convert config to dictionary for multiprocessing
    config_dict = {
        "rotation_range": config.rotation_range,
        "brightness_range": config.brightness_range,
        "noise_range": config.noise_range,
        "scale_range": config.scale_range,
        "contrast_range": config.contrast_range,
        "augmentation_depth": config.augmentation_depth,
    }

    # Launch worker processes
    results_queue = mp.Queue()
    processes = []

    for rank in range(world_size):
        p = mp.Process(
            target=worker_process,
            args=(rank, world_size, total_samples, config_dict, results_queue),
        )
        p.start()
        processes.append(p)

    # Collect results
    results = []
    for _ in range(world_size):
        result = results_queue.get()
        results.append(result)

    # Wait for completion
    for p in processes:
        p.join()

    # Analyze results
    total_processed = sum(r["processed"] for r in results)
    print(f"Total samples processed: {total_processed}/{total_samples}")

    for result in sorted(results, key=lambda x: x["rank"]):
        print(f"Rank {result['rank']}: {result['processed']} samples")


if __name__ == "__main__":
    run_distributed_training()
