"""Who sees which sample, in which order (``rankwise.data``).

- :mod:`~rankwise.data.partition`: contiguous and strided splits of ``range(N)`` over ranks.
- :mod:`~rankwise.data.permutation`: a seeded permutation of ``[0, N)`` in O(1) memory, from
  rankwise's own hashing (``ORDER_VERSION`` names the algorithm).
- :mod:`~rankwise.data.sampler`: :class:`DistributedSampler`, a torch ``DistributedSampler``
  subclass with an elastic resume cursor; :mod:`~rankwise.data.passes`: its pass iterator,
  ``Stateful`` for torchdata's ``StatefulDataLoader``.
- :mod:`~rankwise.data.shares`: :class:`~rankwise.data.shares.GlobalBatchShares`, a global
  batch the world does not divide, taken in per-rank shares that differ by at most one.
- :mod:`~rankwise.data.batches`: :class:`DistributedBatchIterator`.
- :mod:`~rankwise.data.blocks` / :mod:`~rankwise.data.strategies`: :class:`FetchDataset`,
  block-shuffled batches from on-disk sources (:class:`Streaming`, :class:`BlockShuffling`;
  :mod:`~rankwise.data.weighted`: :class:`BlockWeightedSampling`,
  :class:`ClassBalancedSampling`);
  :mod:`~rankwise.data.fetch_plan` / :mod:`~rankwise.data.fetch_state`: who reads which fetch,
  and the rest of an epoch after a stop (its resumable state).
"""

from rankwise.data.batches import DistributedBatchIterator
from rankwise.data.blocks import FetchDataset, default_fetch, rank_fetches, rows_per_rank
from rankwise.data.fetch_io import dense_tensor
from rankwise.data.partition import (
    DistributedRangeSplitter,
    contiguous_owner,
    contiguous_range,
    strided_count,
    strided_positions,
)
from rankwise.data.permutation import ORDER_VERSION, Permutation, permutation_keys
from rankwise.data.sampler import DistributedSampler
from rankwise.data.strategies import BlockShuffling, Strategy, Streaming
from rankwise.data.weighted import BlockWeightedSampling, ClassBalancedSampling

__all__ = [
    "ORDER_VERSION",
    "BlockShuffling",
    "BlockWeightedSampling",
    "ClassBalancedSampling",
    "DistributedBatchIterator",
    "DistributedRangeSplitter",
    "DistributedSampler",
    "FetchDataset",
    "Permutation",
    "Strategy",
    "Streaming",
    "contiguous_owner",
    "contiguous_range",
    "default_fetch",
    "dense_tensor",
    "permutation_keys",
    "rank_fetches",
    "rows_per_rank",
    "strided_count",
    "strided_positions",
]
