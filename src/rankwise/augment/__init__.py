"""Deterministic per-sample augmentation (``rankwise.augment``).

Two modes (see docs/augment.md):

- DPA's rank-aware API: :func:`gen_distributed_augmentation_params`,
  :func:`stream_distributed_augmentation_chain`, :class:`RankAwareSeedGenerator` — the same
  sample gets different parameters on different ranks, so results depend on the world size.
- The training mode: :func:`generate_params` keyed by ``(base_seed, epoch, sample_id)``,
  vectorised, identical whatever the world size; :func:`apply_augmentation` applies the
  parameters to a whole batch; :class:`AugmentedDataset` / :func:`augment_batch` wire it up.

>>> import numpy as np, torch
>>> params = generate_params(np.arange(4), epoch=0, config=get_preset("mild"))
>>> apply_augmentation(torch.rand(4, 3, 16, 16), params).shape
torch.Size([4, 3, 16, 16])
"""

from rankwise.augment.apply import apply_augmentation, gaussian_noise
from rankwise.augment.dataset import AugmentedDataset, augment_batch
from rankwise.augment.params import (
    PARAM_NAMES,
    AugmentationConfig,
    gen_distributed_augmentation_params,
    generate_params,
    get_preset,
    stream_distributed_augmentation_chain,
)
from rankwise.augment.seeds import RankAwareSeedGenerator, counter_hash

__all__ = [
    "PARAM_NAMES",
    "AugmentationConfig",
    "AugmentedDataset",
    "RankAwareSeedGenerator",
    "apply_augmentation",
    "augment_batch",
    "counter_hash",
    "gaussian_noise",
    "gen_distributed_augmentation_params",
    "generate_params",
    "get_preset",
    "stream_distributed_augmentation_chain",
]
