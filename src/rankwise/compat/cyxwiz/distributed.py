"""The CyxWiz guide's ``cx.distributed``: rankwise's process group, DDP, data and trainer.

Every name is the core object (``cx.distributed.init`` *is* :func:`rankwise.distributed.init`)
except three thin adapters: :class:`DistributedSampler` (the guide's method-style sizes),
:class:`DistributedDataParallel` (the guide's method names over
:class:`rankwise.parallel.ExplicitDDP`) and :class:`DistributedTrainer` (binds the guide's
``cx.AdamOptimizer(lr)`` to the model when the trainer is built). See docs/seeds/cyxwiz.md.

>>> import rankwise.compat.cyxwiz as cx
>>> cx.distributed.init().world_size         # no RANK / WORLD_SIZE: a world of one
1
>>> cx.distributed.is_master(), cx.distributed.get_local_rank()
(True, 0)
>>> cx.distributed.finalize()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rankwise.compat.cyxwiz.sampler import DistributedSampler
from rankwise.data import DistributedBatchIterator
from rankwise.distributed import (
    BackendType,
    DistributedConfig,
    finalize,
    get_local_rank,
    get_rank,
    get_world_size,
    init,
    is_initialized,
    is_master,
)
from rankwise.distributed import barrier as barrier
from rankwise.parallel import DDPConfig, ExplicitDDP, OptimizerRecipe, as_optimizer
from rankwise.train import DistributedTrainer as _CoreTrainer
from rankwise.train import DistributedTrainingConfig, DistributedTrainingHistory

__all__ = [
    "BackendType",
    "DDPConfig",
    "DistributedBatchIterator",
    "DistributedConfig",
    "DistributedDataParallel",
    "DistributedSampler",
    "DistributedTrainer",
    "DistributedTrainingConfig",
    "DistributedTrainingHistory",
    "barrier",
    "finalize",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "init",
    "is_initialized",
    "is_master",
]


class DistributedDataParallel(ExplicitDDP):
    """The guide's ``DistributedDataParallel(model, ddp_config)``: :class:`ExplicitDDP` with the
    guide's names. ``backward(grad_output)`` accumulates locally, ``sync_gradients()``
    all-reduces (averages) once, ``update_parameters(optimizer)`` syncs if still needed, steps
    and clears the gradients.

    >>> import rankwise.compat.cyxwiz as cx
    >>> model = cx.SequentialModel().add(cx.LinearModule(3, 2))
    >>> ddp = cx.distributed.DistributedDataParallel(model, cx.distributed.DDPConfig())
    >>> loss_fn = cx.CrossEntropyLoss()
    >>> loss = loss_fn.forward(ddp.forward(torch.ones(4, 3)), torch.tensor([0, 1, 0, 1]))
    >>> _ = ddp.backward(loss_fn.backward(loss))
    >>> ddp.update_parameters(cx.AdamOptimizer(0.01))
    >>> ddp.get_model() is model, ddp.get_world_size()
    (True, 1)
    """

    def __init__(self, model: nn.Module, ddp_config: DDPConfig | None = None) -> None:
        super().__init__(model, ddp_config)

    def update_parameters(self, optimizer: torch.optim.Optimizer | OptimizerRecipe) -> None:
        """:meth:`ExplicitDDP.step`: sync (unless ``sync_gradients()`` already did), step
        ``optimizer`` (a torch optimizer, or a ``cx.AdamOptimizer`` recipe bound here to this
        model), clear the gradients."""
        self.step(optimizer)

    def get_model(self) -> nn.Module:
        return self.module

    def is_master(self) -> bool:
        return is_master()

    def get_rank(self) -> int:
        return get_rank()

    def get_world_size(self) -> int:
        return get_world_size()


class DistributedTrainer(_CoreTrainer):
    """:class:`rankwise.train.DistributedTrainer` with the guide's ``cx.AdamOptimizer(lr)``
    built over ``model``'s parameters here; any torch optimizer or ``params -> optimizer``
    callable works as in the core trainer."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[..., torch.Tensor] | None,
        optimizer: Any,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
        # The guide's trainer.optimizer exists once the trainer does: bind the recipe now.
        super().__init__(
            model, loss_fn, as_optimizer(optimizer, model.parameters()), *args, **kwargs
        )
