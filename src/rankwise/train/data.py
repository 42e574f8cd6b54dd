"""The trainer's inputs: arrays, Datasets or DataLoaders, turned into per-rank batch streams.

- :func:`as_dataset` turns ``(X, y)`` tensors or numpy arrays into a :class:`TensorPairs`
  (numpy float64 becomes float32, integer targets int64).
- :func:`split_validation` holds out a seeded fraction, the same on every rank and world size.
- :class:`TrainBatches`: the trainer's own stream, sharded and resumable (rankwise's sampler,
  whose cursor moves after every micro-batch, so a checkpoint resumes mid-epoch). In-memory
  tensors are indexed a batch at a time (no per-sample collate); a map-style Dataset goes
  through a ``DataLoader`` built with :func:`loader_options`: on CUDA its batches come pinned
  (``pin_memory``) and :func:`to_device` copies them with ``non_blocking=True``, so the copy
  overlaps the step; workers persist across epochs and prefetch ``prefetch_factor`` batches.
- :class:`UserBatches`: a user's DataLoader, used as it is. Ranks that would run different
  numbers of batches are detected before the first collective of the epoch (:func:`check_even`)
  and refused with the per-rank counts, instead of hanging.
- :class:`EvalBatches`: the padded strided split for exact evaluation (see ``evaluation.py``).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, Subset

import rankwise.distributed as rd
from rankwise.data import DistributedSampler, Permutation
from rankwise.data.shares import GlobalBatchShares
from rankwise.train.config import DistributedTrainingConfig

# The validation hold-out is a rankwise permutation keyed by (seed, this constant): stable
# across numpy versions and unrelated to the sampler's per-epoch orders (small epochs).
_SPLIT_KEY = 2**62 + 17

Batch = Any


class TensorPairs(Dataset[tuple[torch.Tensor, ...]]):
    """In-memory ``(inputs, targets)`` (targets optional) that hands out whole batches.

    ``origin`` maps row i to its index in the data the user passed (after a validation
    split), so audit hooks report the user's sample ids; ``space`` is then the size of that
    data (the ids are in ``[0, space)``).
    """

    def __init__(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor | None,
        origin: np.ndarray | None = None,
        space: int | None = None,
    ) -> None:
        if targets is not None and len(targets) != len(inputs):
            raise ValueError(
                f"X and y must have the same number of samples: len(X) = {len(inputs)}, "
                f"len(y) = {len(targets)}; pass one target per input row."
            )
        self.inputs, self.targets, self.origin = inputs, targets, origin
        self.space = len(inputs) if origin is None or space is None else space

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        return self.take(torch.tensor([i]))  # pragma: no cover - the trainer uses take()

    def take(self, index: torch.Tensor, pin: bool = False) -> tuple[torch.Tensor, ...]:
        """Rows ``index`` of every tensor; ``pin``: gathered straight into page-locked memory
        (one copy), so the host-to-GPU copy that follows runs without blocking the loop."""
        if pin:
            return tuple(_take_pinned(t, index) for t in self._tensors())
        if self.targets is None:
            return (self.inputs[index],)
        return self.inputs[index], self.targets[index]

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.inputs,) if self.targets is None else (self.inputs, self.targets)

    def subset(self, rows: np.ndarray) -> TensorPairs:
        index = torch.from_numpy(rows)
        origin = rows if self.origin is None else self.origin[rows]
        targets = None if self.targets is None else self.targets[index]
        return TensorPairs(self.inputs[index], targets, origin, space=self.space)


def _take_pinned(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    # torch's caching host allocator hands the block out again only once the copy that read
    # it has finished, so a fresh pinned tensor per batch is safe and cheap.
    out = torch.empty((len(index), *tensor.shape[1:]), dtype=tensor.dtype, pin_memory=True)
    return torch.index_select(tensor, 0, index, out=out)


def as_tensor(value: Any, name: str) -> torch.Tensor:
    """A tensor from a tensor or a numpy array: float64 arrays become float32 (torch's
    default dtype for weights), integer arrays int64 (what class-index losses take)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype == np.float64:
            value = value.astype(np.float32)
        elif np.issubdtype(value.dtype, np.integer) or value.dtype == np.bool_:
            value = value.astype(np.int64)
        return torch.from_numpy(np.ascontiguousarray(value))
    raise TypeError(
        f"{name} must be a torch.Tensor or a numpy array, got {type(value).__name__}; for "
        "other data pass a Dataset or DataLoader: trainer.fit(train_set, val_set, config=cfg)."
    )


def as_dataset(x: Any, y: Any = None) -> TensorPairs:
    """``(X, y)`` as a :class:`TensorPairs`; ``y`` may be None (inputs alone)."""
    return TensorPairs(as_tensor(x, "X"), None if y is None else as_tensor(y, "y"))


def is_map_style(data: Any) -> bool:
    return isinstance(data, Dataset) and not isinstance(data, IterableDataset)


def split_validation(dataset: Dataset[Any], fraction: float, seed: int) -> tuple[Any, Any]:
    """``(train, val)``: ``round(N * fraction)`` samples (at least 1) held out.

    The held-out rows are the first of a seeded permutation of ``[0, N)``, so the split is
    the same on every rank and for every world size. Both parts keep dataset order.

    >>> data = as_dataset(torch.arange(10.0).view(10, 1), torch.arange(10))
    >>> train, val = split_validation(data, 0.2, seed=0)
    >>> len(train), len(val), sorted(set(train.origin) | set(val.origin)) == list(range(10))
    (8, 2, True)
    """
    if not is_map_style(dataset):
        raise ValueError(
            "validation_split needs a map-style dataset (with len and indexing), got "
            f"{type(dataset).__name__}; pass the validation data yourself: "
            "trainer.fit(train, val, config=cfg) with validation_split=0."
        )
    n = len(dataset)  # type: ignore[arg-type]
    n_val = max(1, round(n * fraction))
    if n_val >= n:
        raise ValueError(
            f"validation_split ({fraction}) of {n} samples leaves no training data; use a "
            "smaller fraction."
        )
    order = Permutation(n, seed, _SPLIT_KEY).take(0, n)
    val_rows, train_rows = np.sort(order[:n_val]), np.sort(order[n_val:])
    if isinstance(dataset, TensorPairs):
        return dataset.subset(train_rows), dataset.subset(val_rows)
    return Subset(dataset, train_rows.tolist()), Subset(dataset, val_rows.tolist())


def batch_length(batch: Batch) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, dict):
        return batch_length(next(iter(batch.values())))
    if isinstance(batch, Sequence) and batch:
        return batch_length(batch[0])
    raise TypeError(
        f"cannot tell the batch size of a {type(batch).__name__}; batches must be tensors, "
        "or tuples / lists / dicts of tensors."
    )


def to_device(batch: Batch, device: torch.device) -> Batch:
    if device.type == "cpu":
        return batch  # CPU ranks (gloo): data is already there, skip the traversal
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


class UserBatches:
    """A user's DataLoader, as it is. A rankwise DistributedSampler inside it is moved by
    :meth:`advance` and saved in checkpoints; any sampler with ``set_epoch`` gets the epoch."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        sampler = getattr(loader, "sampler", None)
        self.sampler = sampler if isinstance(sampler, DistributedSampler) else None
        self._epoch_sampler = sampler if hasattr(sampler, "set_epoch") else None
        self.sized = _has_len(loader)

    def set_epoch(self, epoch: int) -> None:
        if self._epoch_sampler is not None:
            self._epoch_sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def advance(self, n: int) -> None:
        if self.sampler is not None:
            self.sampler.advance(n)

    def __iter__(self) -> Iterator[tuple[Batch, None]]:
        for batch in self.loader:
            yield batch, None


def _has_len(obj: Any) -> bool:
    try:
        len(obj)
    except TypeError:
        return False
    return True


def gather_int(value: int) -> list[int]:
    """Every rank's ``value`` (one all-gather of an int64 on the collective device, so plain
    NCCL takes it too); ``[value]`` without a group."""
    world = rd.get_world_size()
    if world == 1 or not rd.has_group():
        return [value]
    device = rd.collective_device()
    parts = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    rd.all_gather(parts, torch.tensor([value], dtype=torch.int64, device=device))
    return [int(p) for p in parts]


def check_even(num_batches: int, what: str = "training") -> None:
    """Stop every rank with the per-rank counts when their batch counts differ.

    One all-gather at the start of an epoch: a rank that ran out of batches would otherwise
    wait forever in DDP's all-reduce for peers that are still training.
    """
    per_rank = gather_int(num_batches)
    if len(set(per_rank)) > 1:
        raise ValueError(uneven_message(per_rank, what))


def uneven_message(per_rank: list[int], what: str) -> str:
    listed = ", ".join(f"rank {r}: {n}" for r, n in enumerate(per_rank))
    return (
        f"the {what} DataLoader gives the ranks different numbers of batches ({listed}); "
        "every rank must run the same number of steps or DDP's all-reduce waits forever. "
        "Use rankwise.data.DistributedSampler (it pads every rank to the same count) in your "
        "DataLoader, pass drop_last=True, or pass the Dataset itself and let the trainer "
        "build the loader."
    )


def has_batch_everywhere(has_batch: bool, step: int) -> bool:
    """For loaders without len(): whether every rank has another batch (one all-gather per
    step); raises with the ranks that ran out when only some have."""
    have = [bool(f) for f in gather_int(int(has_batch))]
    if all(have):
        return True
    if not any(have):
        return False
    done = [r for r, h in enumerate(have) if not h]
    raise ValueError(
        f"ranks {done} ran out of batches after {step} steps while the others had more: the "
        "DataLoader (without len()) gives the ranks uneven data. Shard it evenly (e.g. "
        "rankwise.data.FetchDataset gives every rank the same batch count) or drop the tail."
    )


def parse_fit_args(
    args: tuple[Any, ...], config: DistributedTrainingConfig | None, val: Any
) -> tuple[DistributedTrainingConfig, Any, Any]:
    rest = [a for a in args if not isinstance(a, DistributedTrainingConfig)]
    given = [a for a in args if isinstance(a, DistributedTrainingConfig)]
    if config is not None:
        given.append(config)
    if len(given) != 1:
        raise ValueError(
            f"fit needs exactly one DistributedTrainingConfig (got {len(given)}): "
            "fit(X, y, config), fit(X, y, X_val, y_val, config) or fit(train, val, config=config)."
        )
    if rest and isinstance(rest[0], torch.Tensor | np.ndarray):
        if len(rest) not in (2, 4) or val is not None:
            raise ValueError(
                f"fit with arrays takes (X, y) or (X, y, X_val, y_val), got {len(rest)} arrays; "
                "pass targets for every input array."
            )
        train = as_dataset(rest[0], rest[1])
        return given[0], train, as_dataset(rest[2], rest[3]) if len(rest) == 4 else None
    if not rest or len(rest) > 2 or (len(rest) == 2 and val is not None):
        raise ValueError(
            "fit takes fit(X, y, config), fit(X, y, X_val, y_val, config) or fit(train, val=None, "
            f"config=config) with Datasets or DataLoaders; got {len(rest)} data arguments."
        )
    return given[0], rest[0], rest[1] if len(rest) == 2 else val


def eval_data(data: tuple[Any, ...]) -> Any:
    if len(data) == 2:
        return as_dataset(*data)
    if len(data) == 1:
        return as_dataset(data[0]) if isinstance(data[0], torch.Tensor | np.ndarray) else data[0]
    raise ValueError(f"evaluate takes (X, y) or (dataset_or_loader), got {len(data)} arguments.")


def fit_datasets(train: Any, val: Any, cfg: DistributedTrainingConfig) -> tuple[Any, Any]:
    """``(train, validation)`` for a fit: the validation data given (it wins), else a seeded
    ``cfg.validation_split`` hold-out of ``train``, else None."""
    if not cfg.validation_split or val is not None:
        return train, val
    if isinstance(train, DataLoader):
        raise ValueError(
            f"validation_split ({cfg.validation_split}) needs the data itself, not a "
            "DataLoader; pass the Dataset (the trainer builds the loaders) or your own "
            "validation loader: fit(train_loader, val_loader, config=cfg)."
        )
    return split_validation(train, cfg.validation_split, cfg.seed)


# -- the trainer's own batches -------------------------------------------------------------


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


def id_space(source: Any) -> tuple[int, np.ndarray] | None:
    """``(size, held out)`` of the ids a :class:`TrainBatches` reports: they are in
    ``[0, size)``, and the ``held out`` ones (sorted: a validation split's, or those outside a
    ``Subset``) are never trained. None for a user's loader (its ids are unknown)."""
    sampler, origin = getattr(source, "sampler", None), getattr(source, "origin", None)
    if not isinstance(source, TrainBatches) or sampler is None:
        return None
    if origin is None:
        return len(sampler.dataset), np.zeros(0, dtype=np.int64)
    data = source.dataset
    if isinstance(data, TensorPairs):
        size = data.space
    else:  # a Subset: its ids index the data set under it
        under: Any = getattr(data, "dataset", None)
        size = len(under) if _has_len(under) else int(origin.max(initial=-1)) + 1
    return size, np.setdiff1d(np.arange(size, dtype=np.int64), origin)


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
