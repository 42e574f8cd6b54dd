"""AugmentedDataset / augment_batch: one-line deterministic augmentation tied to the epoch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler as TorchSampler

from rankwise.augment import (
    AugmentedDataset,
    apply_augmentation,
    augment_batch,
    generate_params,
    get_preset,
)


class EpochOnly:
    """A stand-in sampler that only has an ``epoch`` attribute."""

    def __init__(self) -> None:
        self.epoch = 0


def images(n: int = 12) -> torch.Tensor:
    return torch.rand(n, 3, 10, 10, generator=torch.Generator().manual_seed(1))


def test_item_is_the_sample_augmented_for_its_index_and_epoch() -> None:
    x, labels = images(), torch.arange(12)
    data = AugmentedDataset(TensorDataset(x, labels), get_preset("mild"), base_seed=4, epoch=2)
    image, label = data[5]
    expected = apply_augmentation(
        x[5:6], generate_params([5], epoch=2, base_seed=4, config=get_preset("mild"))
    )[0]
    assert torch.equal(image, expected) and int(label) == 5
    assert torch.equal(data[5][0], image)  # deterministic
    assert len(data) == 12


def test_epoch_comes_from_torch_sampler() -> None:
    x = images()
    sampler = TorchSampler(range(12), num_replicas=2, rank=1, shuffle=True, seed=0)
    data = AugmentedDataset(list(x), base_seed=1, epoch_source=sampler)
    first = data[3]
    sampler.set_epoch(1)
    assert data.epoch == 1 and not torch.equal(data[3], first)
    sampler.set_epoch(0)
    assert torch.equal(data[3], first)
    data.set_epoch(7)  # forwarded, so the sampler and the augmentation agree
    assert sampler.epoch == 7 and data.epoch == 7


def test_epoch_from_a_plain_attribute_and_own_set_epoch() -> None:
    x = images()
    source = EpochOnly()
    data = AugmentedDataset(list(x), epoch_source=source)
    a = data[0]
    source.epoch = 3
    assert torch.equal(data[0], augment_batch(x[:1], [0], epoch=3)[0])
    assert not torch.equal(data[0], a)
    with pytest.raises(ValueError, match=r"EpochOnly.epoch, which has no set_epoch"):
        data.set_epoch(4)
    own = AugmentedDataset(list(x))
    own.set_epoch(3)
    assert own.epoch == 3 and torch.equal(own[0], data[0])


def test_two_ranks_through_dataloaders_see_what_one_process_sees() -> None:
    x, labels = images(10), torch.arange(10)
    reference = augment_batch(x, np.arange(10), epoch=1, base_seed=3)
    seen: dict[int, torch.Tensor] = {}
    for rank in range(2):
        sampler = TorchSampler(range(10), num_replicas=2, rank=rank, shuffle=True, seed=5)
        sampler.set_epoch(1)
        data = AugmentedDataset(TensorDataset(x, labels), base_seed=3, epoch_source=sampler)
        for batch, ids in DataLoader(data, batch_size=3, sampler=sampler):
            for image, i in zip(batch, ids.tolist(), strict=True):
                seen[i] = image
    assert sorted(seen) == list(range(10))
    for i in range(10):
        torch.testing.assert_close(seen[i], reference[i], atol=1e-6, rtol=1e-6)


def test_augment_batch_takes_tensor_ids() -> None:
    x = images(4)
    ids = torch.tensor([9, 2, 7, 0])
    torch.testing.assert_close(
        augment_batch(x, ids, epoch=5), augment_batch(x, [9, 2, 7, 0], epoch=5)
    )


def test_dataset_errors() -> None:
    with pytest.raises(ValueError, match=r"epoch_source \(object\) has no 'epoch' attribute"):
        AugmentedDataset([torch.zeros(1, 2, 2)], epoch_source=object())
    with pytest.raises(ValueError, match=r"base\[0\] must be a \(C, H, W\) tensor"):
        AugmentedDataset([torch.zeros(2, 2)])[0]
    with pytest.raises(ValueError, match=r"base\[0\] must be a \(C, H, W\) tensor"):
        AugmentedDataset(["not an image"])[0]
    with pytest.raises(ValueError, match=r"epoch \(-1\) must be >= 0"):
        AugmentedDataset([torch.zeros(1, 2, 2)]).set_epoch(-1)
    with pytest.raises(ValueError, match=r"index \(-1\) must be >= 0"):
        AugmentedDataset([torch.zeros(1, 2, 2)])[-1]
