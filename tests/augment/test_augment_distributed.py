"""On real gloo ranks: each rank augments its own shard; together they equal one process."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from rankwise.augment import (
    apply_augmentation,
    gen_distributed_augmentation_params,
    generate_params,
    get_preset,
    stream_distributed_augmentation_chain,
)
from rankwise.data import contiguous_range
from rankwise.testing import run_distributed

TOTAL = 103


def images() -> torch.Tensor:
    return torch.rand(TOTAL, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def augment_my_shard(epoch: int) -> dict[str, Any]:
    """One rank: parameters and augmented images for its contiguous shard, gathered to all."""
    import rankwise.distributed as rd

    rank, world = rd.get_rank(), rd.get_world_size()
    start, end = contiguous_range(TOTAL, world, rank)
    ids = np.arange(start, end)
    params = generate_params(ids, epoch=epoch, base_seed=17, config=get_preset("aggressive"))
    out = apply_augmentation(images()[start:end], params)
    # Pad to the largest shard so every rank sends the same shape, then trim per rank.
    longest = -(-TOTAL // world)
    padded = torch.zeros(longest, *out.shape[1:])
    padded[: len(ids)] = out
    gathered = [torch.empty_like(padded) for _ in range(world)]
    rd.all_gather(gathered, padded)
    sizes = [np.subtract(*contiguous_range(TOTAL, world, r)[::-1]) for r in range(world)]
    return {
        "rank": rank,
        "ids": ids,
        "params": params,
        # As numpy: a tensor crosses the result pipe as a shared-memory fd that the parent can
        # only open while this rank is alive (FileNotFoundError under load once it has exited).
        "images": torch.cat([g[:n] for g, n in zip(gathered, sizes, strict=True)]).numpy(),
        "dpa": list(stream_distributed_augmentation_chain(TOTAL, rank, world, chunk_size=10)),
    }


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_together_equal_a_single_process(world_size: int) -> None:
    results = run_distributed(augment_my_shard, world_size, args=(3,), timeout=80)
    reference = generate_params(
        np.arange(TOTAL), epoch=3, base_seed=17, config=get_preset("aggressive")
    )
    ids = np.concatenate([r["ids"] for r in results])
    np.testing.assert_array_equal(ids, np.arange(TOTAL))
    for name, want in reference.items():
        got = np.concatenate([r["params"][name] for r in results])
        np.testing.assert_array_equal(got, want, err_msg=name)
    single = apply_augmentation(images(), reference)
    for r in results:  # every rank holds the full gathered batch
        torch.testing.assert_close(torch.from_numpy(r["images"]), single, atol=1e-6, rtol=1e-6)
    # The DPA stream, by contrast, is rank-aware: each rank's dicts are its own.
    for r in results:
        assert [d["sample_id"] for d in r["dpa"]] == r["ids"].tolist()
        d0 = r["dpa"][0]
        assert d0 == {
            **gen_distributed_augmentation_params(d0["sample_id"], r["rank"], None, 0, world_size),
            "sample_id": d0["sample_id"],
        }
