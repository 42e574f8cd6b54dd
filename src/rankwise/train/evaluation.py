"""Exact evaluation and prediction over N ranks: every real sample counted once, padding never.

Each rank takes positions ``r, r+R, r+2R, ...`` of the data set in order, padded by wrapping
to ``P = ceil(N / R)`` positions per rank, so every rank runs the same number of forward
passes (FSDP all-gathers parameters in every forward: a rank that skipped one would hang the
others). Padding positions (``>= N``) are always the tail of a rank's list, so each batch is a
prefix of real samples followed by padding; only the prefix is scored::

    N = 10, R = 4, batch 2:  rank 2 -> positions [2, 6] [10 = pad, index 0]   real: 2, 0

Sums of loss, correct predictions and counts are kept in float64 and all-reduced once, so the
result is the same on 1, 2, 3 or 4 ranks up to float rounding of the per-sample losses.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import rankwise.distributed as rd
from rankwise.parallel import Precision
from rankwise.train.data import (
    Batch,
    TensorPairs,
    batch_length,
    has_batch_everywhere,
    is_map_style,
    to_device,
)
from rankwise.train.step import LossFn, is_class_target, model_loss, split_batch


class EvalBatches:
    """This rank's evaluation batches of ``dataset``: ``(batch, real_count)`` pairs.

    >>> data = TensorPairs(torch.arange(10.0).view(10, 1), torch.arange(10))
    >>> [(b[1].tolist(), n) for b, n in EvalBatches(data, 2, world_size=4, rank=2)]
    [([2, 6], 2), ([0], 0)]
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_size: int,
        *,
        world_size: int | None = None,
        rank: int | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        world = rd.get_world_size() if world_size is None else world_size
        rank = rd.get_rank() if rank is None else rank
        self.dataset = dataset
        n = len(dataset)  # type: ignore[arg-type]
        per_rank = -(-n // world)
        positions = rank + world * np.arange(per_rank, dtype=np.int64)
        self.chunks = [
            (
                positions[i : i + batch_size] % max(n, 1),
                int((positions[i : i + batch_size] < n).sum()),
            )
            for i in range(0, per_rank, batch_size)
        ]
        self.loader: DataLoader[Any] | None = None
        if not isinstance(dataset, TensorPairs):
            kwargs: dict[str, Any] = {} if collate_fn is None else {"collate_fn": collate_fn}
            self.loader = DataLoader(
                dataset,
                batch_sampler=[c.tolist() for c, _ in self.chunks],
                num_workers=num_workers,
                **kwargs,
            )

    def __len__(self) -> int:
        return len(self.chunks)

    def __iter__(self) -> Iterator[tuple[Batch, int]]:
        if isinstance(self.dataset, TensorPairs):
            for index, real in self.chunks:
                yield self.dataset.take(torch.from_numpy(index)), real
            return
        assert self.loader is not None
        for batch, (_, real) in zip(self.loader, self.chunks, strict=True):
            yield batch, real


def eval_batches(data: Any, batch_size: int) -> Any:
    """:class:`EvalBatches` for a Dataset, or for a DataLoader's map-style dataset (its batch
    size, collate_fn and workers kept); an iterable-style loader is returned as it is."""
    if isinstance(data, DataLoader):
        if is_map_style(data.dataset):
            return EvalBatches(
                data.dataset,
                data.batch_size or batch_size,
                num_workers=data.num_workers,
                collate_fn=data.collate_fn,
            )
        return data
    if is_map_style(data):
        return EvalBatches(data, batch_size)
    raise TypeError(
        f"cannot evaluate on a {type(data).__name__}; pass (X, y) arrays, a Dataset or a "
        "DataLoader."
    )


def _stream(batches: Any) -> Iterator[tuple[Batch, int]]:
    """``(batch, real_count)`` pairs; for a plain loader, every sample is real and ranks agree
    on when to stop (one small all-gather per batch)."""
    if isinstance(batches, EvalBatches):
        yield from batches
        return
    it = iter(batches)
    step = 0
    while True:
        batch = next(it, None)
        if not has_batch_everywhere(batch is not None, step):
            return
        assert batch is not None
        yield batch, batch_length(batch)
        step += 1


def per_sample_loss(loss_fn: LossFn) -> LossFn:
    """A copy of a mean-reducing torch loss that returns per-sample losses, or None.

    Summing per-sample losses in float64 makes the evaluation loss independent of how the
    samples were grouped into batches and ranks (batch means would round differently).
    """
    if (
        isinstance(loss_fn, nn.modules.loss._Loss)
        and getattr(loss_fn, "reduction", None) == "mean"
        and getattr(loss_fn, "weight", None) is None
    ):
        clone = copy.copy(loss_fn)
        clone.reduction = "none"
        return clone
    return None


@torch.no_grad()
def evaluate_exact(
    model: nn.Module,
    batches: Any,
    loss_fn: LossFn,
    precision: Precision,
    device: torch.device,
) -> tuple[float, float | None, int, int]:
    """``(mean loss, accuracy or None, samples, correct)`` over all ranks' real samples."""
    was_training = model.training
    model.eval()
    per_sample = per_sample_loss(loss_fn)
    # [loss sum, samples, correct, samples with class targets]
    sums = torch.zeros(4, dtype=torch.float64)
    try:
        for batch, real in _stream(batches):
            x, y = split_batch(to_device(batch, device), loss_fn is not None)
            if 0 < real < batch_length(x):
                x = x[:real]
                y = None if y is None else y[:real]
            with precision.autocast():
                out = model(x)  # every rank runs the same number of forwards, padded or not
                if real == 0:
                    continue
                if per_sample is not None:
                    loss_sum = per_sample(out, y).reshape(real, -1).double().mean(1).sum()
                else:
                    loss_sum = model_loss(out, y, loss_fn, model).double() * real
            sums[0] += loss_sum.cpu()
            sums[1] += real
            if is_class_target(out, y):
                sums[2] += (out.argmax(1) == y).sum().cpu()
                sums[3] += real
    finally:
        model.train(was_training)
    # Read the reduced tensor itself (reducing a copy would leave this rank's sums), and
    # decide emptiness on the world's totals so every rank raises or none does.
    totals = rd.all_reduce(sums.to(rd.collective_device())).cpu()
    loss_total, count, correct, classed = (float(v) for v in totals)
    if count == 0:
        raise ValueError("evaluate: the data has no samples; pass a non-empty data set.")
    accuracy = correct / count if classed == count else None
    return loss_total / count, accuracy, int(count), int(correct)


@torch.no_grad()
def predict_all(
    model: nn.Module,
    batches: EvalBatches,
    precision: Precision,
    device: torch.device,
    num_samples: int,
) -> Any:
    """Outputs for every sample in dataset order, on every rank (gathered, padding removed)."""
    was_training = model.training
    model.eval()
    outputs: list[Any] = []
    try:
        for batch, _ in batches:
            x = batch[0] if isinstance(batch, list | tuple) else batch
            with precision.autocast():
                outputs.append(model(to_device(x, device)))
    finally:
        model.train(was_training)
    if outputs and isinstance(outputs[0], dict):
        return {k: _gather([o[k] for o in outputs], num_samples) for k in outputs[0]}
    return _gather(outputs, num_samples)


def _gather(parts: list[Any], num_samples: int) -> torch.Tensor:
    if not parts:  # every rank has P = ceil(N / R) positions: none only when N == 0
        raise ValueError("predict: the data has no samples (len 0); pass a non-empty data set.")
    if not all(isinstance(p, torch.Tensor) for p in parts):
        raise TypeError(
            "predict gathers tensor outputs (or dicts of tensors); the model returned "
            f"{type(parts[0]).__name__}."
        )
    local = torch.cat(parts).to(rd.collective_device())  # [P, ...]: positions r, r+R, ...
    world = rd.get_world_size()
    gathered = rd.all_gather([torch.empty_like(local) for _ in range(world)], local)
    # Interleave: global position p = r + k*R is gathered[r][k].
    merged = torch.stack(gathered, dim=1).reshape(-1, *local.shape[1:])
    return merged[:num_samples].to(parts[0].device)  # where the model put its outputs
