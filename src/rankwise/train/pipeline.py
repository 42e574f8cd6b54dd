"""The trainer's own stream of training batches: :class:`TrainBatches`.

rankwise's :class:`~rankwise.data.DistributedSampler` shards and shuffles; its cursor moves
after every micro-batch, so a checkpoint resumes mid-epoch. In-memory tensors are indexed a
batch at a time (no per-sample collate); a map-style Dataset goes through a ``DataLoader``
built with :func:`loader_options`. What a GPU needs from the input pipeline: on CUDA, batches
arrive in page-locked memory (``pin_memory``) so :func:`~rankwise.train.data.to_device`'s
``non_blocking=True`` copy overlaps the step; workers persist across epochs and prefetch
``prefetch_factor`` batches each.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Subset

from rankwise.data import DistributedSampler
from rankwise.data.shares import GlobalBatchShares
from rankwise.train.config import DistributedTrainingConfig
from rankwise.train.data import Batch, TensorPairs, UserBatches


def loader_options(cfg: DistributedTrainingConfig, device: torch.device) -> dict[str, Any]:
    """The train ``DataLoader``'s keyword arguments for ``device``: pinned batches on CUDA
    (``cfg.pin_memory``), workers that live across epochs, ``cfg.prefetch_factor`` when set.

    >>> cfg = DistributedTrainingConfig(num_workers=4, prefetch_factor=8)
    >>> loader_options(cfg, torch.device("cuda", 0))
    {'num_workers': 4, 'pin_memory': True, 'persistent_workers': True, 'prefetch_factor': 8}
    >>> loader_options(DistributedTrainingConfig(), torch.device("cpu"))
    {'num_workers': 0, 'pin_memory': False}
    """
    options: dict[str, Any] = {
        "num_workers": cfg.num_workers,
        # Page-locked host memory lets to_device's non_blocking copy overlap the step; on a
        # CPU device there is no copy to overlap, so pinning would only cost memory.
        "pin_memory": cfg.pin_memory and device.type == "cuda",
    }
    if cfg.num_workers > 0:
        options["persistent_workers"] = True  # no worker start-up at every epoch
        if cfg.prefetch_factor is not None:  # None: torch's default (2 batches per worker)
            options["prefetch_factor"] = cfg.prefetch_factor
    return options


class _IssuedBatches(BatchSampler):
    """torch's ``BatchSampler(sampler, batch_size, drop_last=False)`` over a rankwise
    DistributedSampler (the last list may be shorter; every rank's count is the same, the
    sampler pads), which can also remember the index lists it hands out."""

    def __init__(self, sampler: DistributedSampler, batch_size: int, record: bool) -> None:
        super().__init__(sampler, batch_size, drop_last=False)
        # DataLoader reads index lists ahead of the loop: remember them in order (only when
        # an audit hook wants them) and hand each out when its batch arrives.
        self.issued: collections.deque[list[int]] | None = collections.deque() if record else None

    def __iter__(self) -> Iterator[list[int]]:
        for chunk in super().__iter__():
            if self.issued is not None:
                self.issued.append(chunk)
            yield chunk


class TrainBatches:
    """This rank's micro-batches of ``dataset`` for one epoch, from rankwise's sampler.

    Iterating yields ``(batch, sample_ids)``; ``sample_ids`` (a tensor of the user's dataset
    indices) only when ``record_ids`` is set, else None. Call :meth:`advance` after each
    micro-batch: it moves the sampler's cursor, which checkpoints save.

    ``global_batch`` (``--on-failure continue`` after a regroup): the world's micro-batch.
    When the world divides it, this is the even split above with ``batch_size`` per rank;
    when not, the ranks take it in shares that differ by at most one
    (:class:`~rankwise.data.shares.GlobalBatchShares`, so ``uneven`` is True) and the loop
    weights each rank's loss by :meth:`loss_weight`.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        options: dict[str, Any] | None = None,
        record_ids: bool = False,
        global_batch: int | None = None,
    ) -> None:
        self.dataset, self.batch_size = dataset, batch_size
        self.sampler = DistributedSampler(len(dataset), shuffle=shuffle, seed=seed)  # type: ignore[arg-type]
        self.record_ids = record_ids
        in_memory = isinstance(dataset, TensorPairs)
        record = record_ids and not in_memory
        self.shares: GlobalBatchShares | None = None
        self.chunks: _IssuedBatches | GlobalBatchShares
        if global_batch is not None and global_batch % self.sampler.num_replicas:
            self.chunks = self.shares = GlobalBatchShares(self.sampler, global_batch, record)
        else:
            self.chunks = _IssuedBatches(self.sampler, batch_size, record)
        self.loader: DataLoader[Any] | None = None
        self.options = options = options or {}  # kept: a regrouped world rebuilds the batches
        self.pin = bool(options.get("pin_memory"))  # in-memory tensors: gathered pinned
        if not in_memory:
            self.loader = DataLoader(dataset, batch_sampler=self.chunks, **options)
        self.origin = _origin(dataset)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.chunks)

    @property
    def uneven(self) -> bool:
        """Whether the ranks' shares of each global batch differ (see ``global_batch``)."""
        return self.shares is not None

    def loss_weight(self, n: int) -> float:
        """The factor for this rank's mean loss over the ``n`` samples of its current micro-batch
        that makes DDP's average the global batch's mean (1.0 when the shares are even)."""
        return 1.0 if self.shares is None else self.shares.weight(n)

    def advance(self, n: int) -> None:
        """Move the cursor past the micro-batch of ``n`` samples just trained (uneven shares:
        past the whole global batch, whatever each rank's share)."""
        if self.shares is None:
            self.sampler.advance(n)
        else:
            self.shares.advance()

    def __iter__(self) -> Iterator[tuple[Batch, torch.Tensor | None]]:
        if isinstance(self.dataset, TensorPairs):
            yield from self._tensor_batches(self.dataset)
            return
        assert self.loader is not None
        for batch in self.loader:
            ids = self.chunks.issued.popleft() if self.chunks.issued is not None else None
            yield batch, None if ids is None else self._ids(torch.tensor(ids))

    def _tensor_batches(self, data: TensorPairs) -> Iterator[tuple[Batch, torch.Tensor | None]]:
        # The pass's indices as one tensor (O(N/R), like the data already in memory), then a
        # view per batch: no per-batch list -> tensor conversion in the step.
        if self.shares is not None:
            for chunk in self.shares.arrays():
                rows = torch.from_numpy(chunk)
                yield data.take(rows, self.pin), self._ids(rows) if self.record_ids else None
            return
        passed = iter(self.sampler)
        index = torch.from_numpy(np.fromiter(passed, dtype=np.int64, count=len(self.sampler)))
        size = self.batch_size
        for start in range(0, len(index), size):
            rows = index[start : start + size]
            yield data.take(rows, self.pin), self._ids(rows) if self.record_ids else None

    def _ids(self, rows: torch.Tensor) -> torch.Tensor:
        return rows if self.origin is None else torch.from_numpy(self.origin[rows.numpy()])


def _origin(dataset: Any) -> np.ndarray | None:
    if isinstance(dataset, TensorPairs):
        return dataset.origin
    if isinstance(dataset, Subset):
        return np.asarray(dataset.indices, dtype=np.int64)
    return None


def train_source(
    train: Any, cfg: DistributedTrainingConfig, record_ids: bool, device: torch.device
) -> Any:
    """The trainer's batch stream: a user's loader (or iterable) as it is, else the trainer's
    own sharded, resumable :class:`TrainBatches` (``record_ids``: keep each batch's ids) with
    :func:`loader_options` for ``device``."""
    if isinstance(train, DataLoader) or not hasattr(train, "__getitem__"):
        return UserBatches(train)
    return TrainBatches(
        train,
        cfg.batch_size,
        shuffle=cfg.shuffle,
        seed=cfg.seed,
        options=loader_options(cfg, device),
        record_ids=record_ids,
    )
