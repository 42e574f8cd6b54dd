"""Deterministic augmentation for a training loop in one line.

- :class:`AugmentedDataset` wraps a map-style dataset: item ``i`` of epoch ``e`` is augmented
  with ``generate_params([i], epoch=e)``, the epoch read from the sampler.
- :func:`augment_batch` does the same for a whole batch already on the device (faster: one
  batched call instead of one per sample).

The sample id is the dataset index, so the augmentation of a sample depends on
``(base_seed, epoch, index)`` only, never on the rank, the world size or the batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rankwise.augment.apply import apply_augmentation
from rankwise.augment.params import AugmentationConfig, generate_params, resolve_config
from rankwise.augment.seeds import MAX_U64
from rankwise.validation import check_epoch, check_int


def augment_batch(
    images: torch.Tensor,
    sample_ids: Any,
    *,
    epoch: int = 0,
    base_seed: int = 0,
    config: AugmentationConfig | None = None,
) -> torch.Tensor:
    """``apply_augmentation(images, generate_params(sample_ids, ...))`` for a (B, C, H, W) batch.

    ``sample_ids`` (B ids: a numpy array, a list or a CPU/GPU tensor) are the dataset indices of
    the images, e.g. what the sampler yielded for this batch.

    >>> x = torch.rand(2, 1, 4, 4)
    >>> y = augment_batch(x, [10, 11], epoch=3)
    >>> torch.equal(y[1:], augment_batch(x[1:], [11], epoch=3))
    True
    """
    if isinstance(sample_ids, torch.Tensor):
        sample_ids = sample_ids.detach().cpu().numpy()
    params = generate_params(
        np.asarray(sample_ids).reshape(-1), epoch=epoch, base_seed=base_seed, config=config
    )
    return apply_augmentation(images, params)


class AugmentedDataset(torch.utils.data.Dataset):
    """A map-style dataset whose item ``i`` is ``base[i]`` augmented for ``(base_seed, epoch, i)``.

    ``base[i]`` is a (C, H, W) float tensor, or a tuple / list whose first element is one (the
    rest, e.g. the label, passes through). The epoch comes from ``epoch_source`` — anything
    with an ``epoch`` attribute, such as rankwise's or torch's ``DistributedSampler`` after
    ``set_epoch`` — or from this object's own :meth:`set_epoch`. Reading it at each item, not at
    construction, keeps the dataset in step with the sampler without further calls.

    With ``DataLoader(num_workers > 0)`` each worker holds a copy of the dataset (and of the
    sampler it points to). With rankwise's :class:`~rankwise.data.DistributedSampler` the epoch
    is read through the sampler's shared-memory :meth:`~rankwise.data.DistributedSampler.shared_epoch`,
    and without a source this object's own epoch lives in shared memory too, so ``set_epoch``
    reaches persistent workers either way (tested). A source without ``shared_epoch``
    (torch's sampler) is copied when the epoch's iterator starts, which is right for ordinary
    workers; with ``persistent_workers=True`` such a copy keeps the first epoch, so use rankwise's
    sampler there, call this dataset's :meth:`set_epoch` with no source, or use
    :func:`augment_batch` on the batch.

    >>> class Source:                      # any object with .epoch; torch's sampler works too
    ...     epoch = 0
    >>> sampler = Source()
    >>> data = AugmentedDataset([torch.ones(1, 4, 4)] * 8, base_seed=7, epoch_source=sampler)
    >>> a = data[3]
    >>> sampler.epoch = 1
    >>> torch.equal(a, data[3])
    False
    """

    def __init__(
        self,
        base: Any,
        config: AugmentationConfig | None = None,
        base_seed: int = 0,
        *,
        epoch_source: Any = None,
        epoch: int = 0,
    ) -> None:
        if epoch_source is not None and not hasattr(epoch_source, "epoch"):
            raise ValueError(
                f"epoch_source ({type(epoch_source).__name__}) has no 'epoch' attribute; "
                "pass the sampler whose set_epoch() you call, or None and call set_epoch()."
            )
        self.base = base
        self.config = resolve_config(config)
        self.base_seed = check_int("base_seed", base_seed, maximum=MAX_U64)
        self.epoch_source = epoch_source
        # Shared memory, like the sampler's: persistent DataLoader workers see set_epoch().
        self._epoch = torch.tensor(check_epoch(epoch), dtype=torch.int64).share_memory_()
        # A source that offers a shared-memory view of its epoch (rankwise's sampler) is read
        # through it, so set_epoch in the main process reaches persistent DataLoader workers,
        # whose copy of the source is otherwise frozen at the first epoch.
        shared = getattr(epoch_source, "shared_epoch", None)
        self._shared_epoch: torch.Tensor | None = shared() if callable(shared) else None

    @property
    def epoch(self) -> int:
        """The epoch items are augmented for: ``epoch_source.epoch`` if there is a source."""
        if self._shared_epoch is not None:
            return int(self._shared_epoch.item())
        if self.epoch_source is not None:
            return int(self.epoch_source.epoch)
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """Augment for ``epoch`` from now on (forwarded to ``epoch_source`` when there is one,
        so the sampler and the augmentation never disagree)."""
        epoch = check_epoch(epoch)
        if self.epoch_source is None:
            self._epoch.fill_(epoch)
        elif hasattr(self.epoch_source, "set_epoch"):
            self.epoch_source.set_epoch(epoch)
        else:
            raise ValueError(
                f"this dataset reads its epoch from {type(self.epoch_source).__name__}.epoch, "
                "which has no set_epoch(); set the epoch there."
            )

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> Any:
        index = check_int("index", index)
        item = self.base[index]
        rest: tuple[Any, ...] | None = None
        if isinstance(item, tuple | list):
            item, rest = item[0], tuple(item[1:])
        if not isinstance(item, torch.Tensor) or item.ndim != 3:
            raise ValueError(
                f"base[{index}] must be a (C, H, W) tensor or a tuple starting with one, got "
                f"{type(item).__name__}{tuple(item.shape) if hasattr(item, 'shape') else ''}."
            )
        params = generate_params(
            np.array([index]), epoch=self.epoch, base_seed=self.base_seed, config=self.config
        )
        image = apply_augmentation(item.unsqueeze(0), params)[0]
        return image if rest is None else (image, *rest)
