"""The trainer's input pipeline options: pinned batches and non-blocking copies on CUDA, workers
that persist and prefetch. Pure: the loaders are built (on a CUDA device object too), never
started, so no GPU and no worker process is needed."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from rankwise.train import DistributedTrainingConfig
from rankwise.train.data import TensorPairs, TrainBatches, loader_options, train_source

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


@pytest.mark.parametrize(
    ("fields", "device", "expected"),
    [
        ({}, CPU, {"num_workers": 0, "pin_memory": False}),
        ({}, CUDA, {"num_workers": 0, "pin_memory": True}),
        ({"pin_memory": False}, CUDA, {"num_workers": 0, "pin_memory": False}),
        (
            {"num_workers": 2},
            CUDA,
            {"num_workers": 2, "pin_memory": True, "persistent_workers": True},
        ),
        (
            {"num_workers": 3, "prefetch_factor": 6},
            CPU,
            {
                "num_workers": 3,
                "pin_memory": False,
                "persistent_workers": True,
                "prefetch_factor": 6,
            },
        ),
    ],
)
def test_loader_options_follow_the_device_and_the_config(
    fields: dict[str, Any], device: torch.device, expected: dict[str, Any]
) -> None:
    assert loader_options(DistributedTrainingConfig(**fields), device) == expected


def test_a_dataset_gets_a_loader_built_with_those_options() -> None:
    data = TensorDataset(torch.arange(20.0).view(10, 2), torch.arange(10))
    cfg = DistributedTrainingConfig(batch_size=4, num_workers=2, prefetch_factor=3)
    on_gpu = train_source(data, cfg, False, CUDA).loader
    assert (on_gpu.pin_memory, on_gpu.persistent_workers, on_gpu.prefetch_factor) == (True, True, 3)
    assert on_gpu.num_workers == 2
    on_cpu = train_source(data, cfg, False, CPU).loader
    assert (on_cpu.pin_memory, on_cpu.prefetch_factor) == (False, 3)
    plain = train_source(data, DistributedTrainingConfig(), False, CUDA).loader
    assert (plain.num_workers, plain.persistent_workers, plain.prefetch_factor) == (0, False, None)


def test_in_memory_tensors_are_gathered_pinned_only_for_a_gpu() -> None:
    pairs = TensorPairs(torch.arange(20.0).view(10, 2), torch.arange(10))
    cfg = DistributedTrainingConfig(batch_size=4, shuffle=False)
    assert train_source(pairs, cfg, False, CUDA).pin
    source = train_source(pairs, cfg, False, CPU)
    assert isinstance(source, TrainBatches) and not source.pin and source.loader is None
    source.set_epoch(0)
    batches = [batch for batch, _ in source]
    assert torch.equal(torch.cat([x for x, _ in batches]), pairs.inputs)
    assert not any(t.is_pinned() for batch in batches for t in batch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_pinned_take_gathers_the_same_rows() -> None:  # pragma: no cover - GPU machines
    pairs = TensorPairs(torch.randn(10, 3), torch.arange(10))
    rows = torch.tensor([7, 2, 5])
    pinned = pairs.take(rows, pin=True)
    assert all(t.is_pinned() for t in pinned)
    assert all(torch.equal(a, b) for a, b in zip(pinned, pairs.take(rows), strict=True))
