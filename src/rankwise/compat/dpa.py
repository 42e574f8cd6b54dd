"""The DPA guide's names (``src.distributed``, ``src.dpa``) on rankwise: names only.

``from src.distributed import X`` and ``from src.dpa import X`` both become
``from rankwise.compat.dpa import X``; everything here is the core object itself, from
:mod:`rankwise.augment` (parameters, presets, seeds) and :mod:`rankwise.data` (the contiguous
range split). See docs/seeds/dpa.md for the guide's calls one by one.

>>> from rankwise.compat.dpa import DistributedRangeSplitter, get_preset
>>> DistributedRangeSplitter(23, 4).get_all_ranges()
[(0, 6), (6, 12), (12, 18), (18, 23)]
>>> get_preset("mild").rotation_range
(-15.0, 15.0)
"""

from rankwise.augment import (
    PARAM_NAMES,
    AugmentationConfig,
    RankAwareSeedGenerator,
    gen_distributed_augmentation_params,
    get_preset,
    stream_distributed_augmentation_chain,
)
from rankwise.data import DistributedRangeSplitter

__all__ = [
    "PARAM_NAMES",
    "AugmentationConfig",
    "DistributedRangeSplitter",
    "RankAwareSeedGenerator",
    "gen_distributed_augmentation_params",
    "get_preset",
    "stream_distributed_augmentation_chain",
]
