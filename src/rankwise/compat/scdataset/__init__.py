"""The scDataset guide's names on rankwise (``from scdataset import ...``): names and argument
adapters only; the behaviour is :mod:`rankwise.data`'s.

``from scdataset import scDataset, BlockShuffling`` becomes
``from rankwise.compat.scdataset import scDataset, BlockShuffling``, and
``from scdataset.transforms import fetch_transform_adata`` becomes
``from rankwise.compat.scdataset.transforms import fetch_transform_adata``. The strategies are
rankwise's own (:class:`~rankwise.data.Streaming`, :class:`~rankwise.data.BlockShuffling`,
:class:`~rankwise.data.BlockWeightedSampling`, :class:`~rankwise.data.ClassBalancedSampling`,
with the released package's arguments). See docs/seeds/scdataset.md.

>>> import numpy as np
>>> ds = scDataset(np.arange(10), Streaming(), batch_size=2, fetch_factor=1, rank=1, world_size=4)
>>> [b.tolist() for b in ds]        # fetch round-robin; every rank gets ceil(10 / 4) = 3 rows
[[2, 3], [9]]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rankwise.data import (
    BlockShuffling,
    BlockWeightedSampling,
    ClassBalancedSampling,
    FetchDataset,
    Streaming,
)
from rankwise.data import Strategy as SamplingStrategy

__all__ = [
    "BlockShuffling",
    "BlockWeightedSampling",
    "ClassBalancedSampling",
    "SamplingStrategy",
    "Streaming",
    "scDataset",
]


class scDataset(FetchDataset):  # the released package's name, lower-case s
    """:class:`~rankwise.data.FetchDataset` under scDataset's constructor: the first argument
    is ``data_collection``, and ``collection`` / ``fetch_size`` read as in the released package.

    Differences, all deliberate (docs/seeds/scdataset.md): every rank yields the same number of
    batches (the released package's can differ, which hangs DDP); ``seed=None`` means seed 0
    (reproducible) rather than a random seed; the epoch moves only with :meth:`set_epoch`, as
    the guide says, not by itself on each ``iter``; ``drop_last`` drops short batches per rank
    rather than per fetch.
    """

    def __init__(
        self,
        data_collection: Any,
        strategy: SamplingStrategy,
        batch_size: int,
        fetch_factor: int = 16,
        drop_last: bool = False,
        fetch_callback: Callable[[Any, Any], Any] | None = None,
        fetch_transform: Callable[[Any], Any] | None = None,
        batch_callback: Callable[[Any, Any], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            data_collection,
            strategy,
            batch_size,
            fetch_factor=fetch_factor,
            drop_last=drop_last,
            fetch_callback=fetch_callback,
            fetch_transform=fetch_transform,
            batch_callback=batch_callback,
            batch_transform=batch_transform,
            rank=rank,
            world_size=world_size,
            seed=seed,
        )

    @property
    def collection(self) -> Any:
        """The data collection (the released package's name for ``source``)."""
        return self.source

    @property
    def fetch_size(self) -> int:
        """Rows per fetch: ``batch_size * fetch_factor``."""
        return self.batch_size * self.fetch_factor
