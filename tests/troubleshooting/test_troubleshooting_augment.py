"""docs/troubleshooting.md's rows for rankwise.augment (AugmentationConfig, apply_augmentation's
images and parameters, AugmentedDataset, sample ids and seeds), each provoked in this process.
tests/troubleshooting/test_troubleshooting.py checks that these rows and triggers pair up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import rankwise.augment as ra
from helpers.troubleshooting_table import check_row, raised

_IMAGES = torch.zeros(2, 1, 4, 4)


def _apply(images: Any = _IMAGES, **params: Any) -> BaseException:
    return raised(ra.apply_augmentation, images, params)


class _EpochOnly:
    """An epoch source without set_epoch (a plain counter object)."""

    epoch = 0


TRIGGERS: dict[str, Callable[[], BaseException]] = {
    "augment-unknown-parameter": lambda: _apply(rotate=10.0),
    "augment-scale": lambda: _apply(scale=[1.0, 0.0]),
    "augment-noise": lambda: _apply(noise=[-0.1, 0.1], seed=[1, 2]),
    "augment-images-type": lambda: _apply(np.zeros((2, 1, 4, 4)), rotation=10.0),
    "augment-images-shape": lambda: _apply(torch.zeros(1, 4, 4), rotation=10.0),
    "augment-images-dtype": lambda: _apply(
        torch.zeros(2, 1, 4, 4, dtype=torch.uint8), rotation=10.0
    ),
    "augment-parameter-numbers": lambda: _apply(rotation="ten"),
    "augment-parameter-finite": lambda: _apply(rotation=[10.0, float("nan")]),
    "augment-seed-tensor": lambda: _apply(noise=0.1, seed=torch.tensor([0.5, 1.5])),
    "augment-seed-array": lambda: _apply(noise=0.1, seed=[0.5, 1.5]),
    "augment-parameter-shape": lambda: _apply(rotation=[10.0, 20.0, 30.0]),
    "augment-shared-noise": lambda: _apply(noise=0.1),
    "augment-epoch-source": lambda: raised(
        ra.AugmentedDataset, [torch.zeros(1, 4, 4)], epoch_source=3
    ),
    "augment-set-epoch-source": lambda: raised(
        ra.AugmentedDataset([torch.zeros(1, 4, 4)], epoch_source=_EpochOnly()).set_epoch, 1
    ),
    "augment-item": lambda: raised(ra.AugmentedDataset([torch.zeros(4, 4)]).__getitem__, 0),
    "augment-range-pair": lambda: raised(ra.AugmentationConfig, rotation_range=30),
    "augment-range-finite": lambda: raised(
        ra.AugmentationConfig, rotation_range=(-30, float("inf"))
    ),
    "augment-range-low": lambda: raised(ra.AugmentationConfig, scale_range=(0.0, 1.2)),
    "augment-config-type": lambda: raised(ra.generate_params, [0, 1], config="moderate"),
    "augment-sample-ids-type": lambda: raised(ra.generate_params, [0.0, 1.0]),
    "augment-sample-id-negative": lambda: raised(ra.generate_params, [0, -1]),
    "augment-seed-range": lambda: raised(ra.generate_params, [0, 1], base_seed=2**64),
}


@pytest.mark.parametrize("row_id", sorted(TRIGGERS))
def test_documented_message_is_the_one_raised(row_id: str) -> None:
    check_row(row_id, TRIGGERS[row_id])
