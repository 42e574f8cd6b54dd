"""Across layers: sampler + augmentation give each sample the same image whatever the world size.

The mission's promise — reproducible results even when the number of ranks changes — rests on
two pieces meeting: `rankwise.data.DistributedSampler` (who sees which sample, resumable across
world sizes) and `rankwise.augment` (parameters keyed by (seed, epoch, sample id), not by rank).
Simulated ranks (no processes): the maths is a pure function of (rank, world size).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from rankwise.augment import AugmentedDataset, augment_batch, get_preset
from rankwise.data import DistributedSampler

N, EPOCH, SEED, BASE_SEED = 12, 1, 5, 3
IMAGES = torch.rand(N, 3, 8, 8, generator=torch.Generator().manual_seed(0))
REFERENCE = augment_batch(
    IMAGES, np.arange(N), epoch=EPOCH, base_seed=BASE_SEED, config=get_preset("moderate")
)


def _rank_view(sampler: DistributedSampler) -> tuple[AugmentedDataset, DataLoader]:  # type: ignore[type-arg]
    data = AugmentedDataset(
        TensorDataset(IMAGES, torch.arange(N)),
        get_preset("moderate"),
        base_seed=BASE_SEED,
        epoch_source=sampler,
    )
    return data, DataLoader(data, batch_size=2, sampler=sampler)


def _collect(
    loader: DataLoader, seen: dict[int, list[torch.Tensor]], batches: int | None = None
) -> int:  # type: ignore[type-arg]
    taken = 0
    for images, ids in loader:
        for image, i in zip(images, ids.tolist(), strict=True):
            seen.setdefault(i, []).append(image)
        taken += 1
        if batches is not None and taken == batches:
            break
    return taken


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_world_size_sees_the_same_augmented_samples(world: int) -> None:
    seen: dict[int, list[torch.Tensor]] = {}
    for rank in range(world):
        sampler = DistributedSampler(N, num_replicas=world, rank=rank, seed=SEED)
        sampler.set_epoch(EPOCH)
        _collect(_rank_view(sampler)[1], seen)
    assert sorted(seen) == list(range(N))  # 12 divides by 1..4: no padding, each sample once
    for i, views in seen.items():
        assert len(views) == 1
        assert torch.equal(views[0], REFERENCE[i]), f"sample {i} differs on a world of {world}"


def test_stop_on_three_ranks_resume_on_two_sees_each_sample_once_identically() -> None:
    seen: dict[int, list[torch.Tensor]] = {}
    states = []
    for rank in range(3):
        sampler = DistributedSampler(N, num_replicas=3, rank=rank, seed=SEED)
        sampler.set_epoch(EPOCH)
        _collect(_rank_view(sampler)[1], seen, batches=1)  # one step of 2 samples per rank
        sampler.advance(2)
        states.append(sampler.state_dict())
    assert all(s == states[0] for s in states)  # lockstep: any rank's state describes all
    for rank in range(2):
        sampler = DistributedSampler(N, num_replicas=2, rank=rank, seed=0)
        sampler.load_state_dict(states[0])
        sampler.set_epoch(EPOCH)  # the usual call at the top of the loop keeps the cursor
        _collect(_rank_view(sampler)[1], seen)
    assert sorted(seen) == list(range(N))
    for i, views in seen.items():
        assert len(views) == 1 and torch.equal(views[0], REFERENCE[i])


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_set_epoch_reaches_persistent_workers_through_the_sampler(context: str) -> None:
    # Persistent workers keep the copy of the dataset (and of the sampler inside it) that they
    # got at the first epoch; the sampler's shared-memory epoch must still move them on.
    sampler = DistributedSampler(N, num_replicas=2, rank=1, seed=SEED)
    data, _ = _rank_view(sampler)
    loader = DataLoader(
        data,
        batch_size=3,
        sampler=sampler,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=context,
    )
    for epoch in (0, 1, 2):
        sampler.set_epoch(epoch)
        expected = augment_batch(
            IMAGES, np.arange(N), epoch=epoch, base_seed=BASE_SEED, config=get_preset("moderate")
        )
        seen = 0
        for images, ids in loader:
            for image, i in zip(images, ids.tolist(), strict=True):
                assert torch.equal(image, expected[i]), f"epoch {epoch}, sample {i}: stale epoch"
                seen += 1
        assert seen == len(sampler) == N // 2


def test_own_set_epoch_reaches_persistent_workers() -> None:
    # No sampler to follow: the dataset's own epoch must reach workers that outlive an epoch.
    data = AugmentedDataset(
        [(IMAGES[i], i) for i in range(N)], get_preset("moderate"), base_seed=BASE_SEED
    )
    loader = DataLoader(data, batch_size=4, num_workers=2, persistent_workers=True)
    for epoch in (0, 1, 2):
        data.set_epoch(epoch)
        expected = augment_batch(
            IMAGES, np.arange(N), epoch=epoch, base_seed=BASE_SEED, config=get_preset("moderate")
        )
        for images, ids in loader:
            for image, i in zip(images, ids.tolist(), strict=True):
                assert torch.equal(image, expected[i]), f"epoch {epoch}, sample {i}: stale epoch"
