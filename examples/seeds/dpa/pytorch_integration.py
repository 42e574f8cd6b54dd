"""DPA guide, "Integration Examples: PyTorch Distributed Training".

The guide's code with its imports changed, run on 2 ranks the way torch jobs start:

    torchrun --nproc_per_node=2 examples/seeds/dpa/pytorch_integration.py
    rankwise launch --nproc-per-node 2 examples/seeds/dpa/pytorch_integration.py

Lines marked "port:" are not the guide's: it uses ``backend='nccl'``, which needs one GPU per
rank (the port picks gloo without CUDA), and leaves ``base_dataset`` and ``augmented_data``
undefined (the port makes 100 tiny images on the fly and applies brightness and contrast).

Two faults of the guide's recipe, kept so that the port shows what it does (see
docs/seeds/dpa.md for the rankwise way, ``rankwise.augment.AugmentedDataset``):

- It shards twice. The stream already holds only this rank's contiguous range (50 of 100
  samples on 2 ranks), and torch's DistributedSampler then gives each rank half of *that*:
  every rank trains on 25 samples per epoch, 50 of the 100 in all.
- ``AugmentedDataset`` indexes ``base_dataset`` from 0 on every rank, so every rank reads
  base samples 0-49 (rank 1 with the parameters of samples 50-99), and together the ranks
  never see samples 50-99.
"""

import torch
import torch.distributed as dist

from rankwise.compat.dpa import get_preset, stream_distributed_augmentation_chain

# port: the guide's base_dataset, 100 images of 3x8x8 with labels, made on the fly
base_dataset = torch.utils.data.TensorDataset(
    torch.rand(100, 3, 8, 8, generator=torch.Generator().manual_seed(0)), torch.arange(100)
)


def setup_distributed():  # type: ignore[no-untyped-def]
    """Initialize PyTorch distributed training."""
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")  # port
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    return rank, world_size


def get_distributed_dataloader(dataset_size, batch_size, config):  # type: ignore[no-untyped-def]
    """Create distributed dataloader with DPA augmentations."""
    rank, world_size = setup_distributed()

    # Get augmentation parameters for this rank
    param_stream = stream_distributed_augmentation_chain(
        num_samples=dataset_size, rank=rank, world_size=world_size, config=config
    )

    # Convert to list for indexing (if dataset_size is manageable)
    augmentation_params = list(param_stream)

    # Create custom dataset with augmentations
    class AugmentedDataset(torch.utils.data.Dataset):
        def __init__(self, base_dataset, aug_params):  # type: ignore[no-untyped-def]
            self.base_dataset = base_dataset
            self.aug_params = aug_params

        def __len__(self):  # type: ignore[no-untyped-def]
            return len(self.aug_params)

        def __getitem__(self, idx):  # type: ignore[no-untyped-def]
            data = self.base_dataset[idx]
            params = self.aug_params[idx]
            # Apply augmentations using params
            image, label = data  # port: brightness, then contrast around the image's mean
            mean = image.mean()
            augmented_data = (
                (image * params["brightness"] - mean) * params["contrast"] + mean,
                label,
            )
            return augmented_data

    # Create distributed sampler
    dataset = AugmentedDataset(base_dataset, augmentation_params)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset)

    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler)


if __name__ == "__main__":  # port: the guide stops at the function; use it for one epoch
    loader = get_distributed_dataloader(100, batch_size=8, config=get_preset("moderate"))
    labels = torch.cat([batch_labels for _, batch_labels in loader])
    print(
        f"rank {dist.get_rank()}: stream {len(loader.dataset)} samples, "
        f"sampler {len(labels)} samples, base labels {sorted(labels.tolist())}"
    )
    dist.destroy_process_group()
