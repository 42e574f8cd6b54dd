"""The CyxWiz guide's model-building names, on torch: ``cx.SequentialModel``, ``cx.LinearModule``,
``cx.ReLUModule``, ``cx.CrossEntropyLoss``, ``cx.AdamOptimizer`` (and ``cx.SGDOptimizer``).

Modules are torch modules (``LinearModule`` *is* ``torch.nn.Linear``), so they go anywhere
torch's do. The guide builds its optimizer before any parameters exist
(``cx.AdamOptimizer(0.001)``), so an optimizer here is a recipe that builds the torch
optimizer the first time it is given parameters (by the trainer, or by
``DistributedDataParallel.update_parameters``) and is then bound to them.

>>> import rankwise.compat.cyxwiz as cx
>>> model = cx.SequentialModel()
>>> model.add(cx.LinearModule(4, 8)).add(cx.ReLUModule()).add(cx.LinearModule(8, 2))
SequentialModel(...)
>>> adam = cx.AdamOptimizer(0.001)
>>> type(adam.bind(model.parameters())).__name__, adam.bind(model.parameters()) is adam.optimizer
('Adam', True)
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rankwise.train.checkpoint import load_file, save_file

__all__ = [
    "AdamOptimizer",
    "CrossEntropyLoss",
    "LinearModule",
    "ReLUModule",
    "SGDOptimizer",
    "SequentialModel",
]

LinearModule = nn.Linear
ReLUModule = nn.ReLU


class SequentialModel(nn.Sequential):
    """``torch.nn.Sequential`` with the guide's ``add`` and ``save`` (and ``load`` to read it back)."""

    def add(self, module: nn.Module) -> SequentialModel:
        """Append ``module`` as the next layer; returns the model (calls chain)."""
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"SequentialModel.add takes a module such as cx.LinearModule(784, 256), got "
                f"{type(module).__name__}."
            )
        self.append(module)
        return self

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the weights to ``path`` atomically, with a checksum manifest beside it
        (rankwise's checkpoint file format); :meth:`load` reads them back."""
        return save_file({"model": self.state_dict()}, path, meta={"kind": "cyxwiz-model"})

    def load(self, path: str | os.PathLike[str]) -> SequentialModel:
        """Load weights that :meth:`save` wrote into this (same-architecture) model."""
        self.load_state_dict(load_file(path)["model"])
        return self


class CrossEntropyLoss(nn.CrossEntropyLoss):
    """torch's cross-entropy (mean over the batch), plus the guide's ``forward`` / ``backward``
    pair for :class:`DistributedDataParallel`'s ``backward(grad_output)``.

    ``backward(loss)`` is d ``loss`` / d predictions, for the predictions of the last
    ``forward``; pass the loss as you scaled it (``loss / accumulation_steps``) and the scale
    reaches the gradients.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = super().forward(input, target)
        self._last = (input, loss)
        return loss

    def backward(self, loss: torch.Tensor | None = None) -> torch.Tensor:
        """The gradient of ``loss`` (default: what the last ``forward`` returned) with respect
        to that forward's predictions."""
        if loss is Ellipsis:
            raise TypeError(
                "loss_fn.backward(...) was called with a literal `...`, which the guide uses "
                "for elided arguments; pass the loss forward() returned, scaled as you need: "
                "loss_fn.backward(loss)."
            )
        if self._last is None or not self._last[0].requires_grad:
            raise RuntimeError(
                "CrossEntropyLoss.backward() needs a forward(output, target) on an output "
                "that requires grad (a training forward) first."
            )
        predictions, last_loss = self._last
        (grad,) = torch.autograd.grad(last_loss if loss is None else loss, predictions)
        return grad


class _Recipe:
    """An optimizer built over the first parameters it is given, then bound to them."""

    def __init__(self, learning_rate: float) -> None:
        if (
            isinstance(learning_rate, bool)
            or not isinstance(learning_rate, int | float)
            or not math.isfinite(learning_rate)
            or learning_rate <= 0
        ):
            raise ValueError(
                f"{type(self).__name__} learning_rate ({learning_rate!r}) must be a finite "
                "number > 0, e.g. 0.001."
            )
        self.learning_rate = float(learning_rate)
        self.optimizer: torch.optim.Optimizer | None = None

    def _build(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        raise NotImplementedError

    def bind(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        """The torch optimizer over ``params``: built on the first call, the same one after."""
        params = list(params)
        if self.optimizer is None:
            self.optimizer = self._build(params)
            return self.optimizer
        bound = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        if {id(p) for p in params} != bound:
            raise ValueError(
                f"this {type(self).__name__} is already bound to another model's parameters; "
                f"create one {type(self).__name__} per model."
            )
        return self.optimizer

    # The trainer takes a callable params -> optimizer.
    __call__ = bind


class AdamOptimizer(_Recipe):
    """``torch.optim.Adam(params, lr=learning_rate, betas=(beta1, beta2), eps=epsilon)``."""

    def __init__(
        self,
        learning_rate: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
    ) -> None:
        super().__init__(learning_rate)
        self.betas = (beta1, beta2)
        self.epsilon = epsilon

    def _build(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=self.learning_rate, betas=self.betas, eps=self.epsilon)


class SGDOptimizer(_Recipe):
    """``torch.optim.SGD(params, lr=learning_rate, momentum=momentum)`` (not in the guide's
    Quick Start; its update is linear in the gradient, which makes equivalences checkable)."""

    def __init__(self, learning_rate: float = 0.01, momentum: float = 0.0) -> None:
        super().__init__(learning_rate)
        self.momentum = momentum

    def _build(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.learning_rate, momentum=self.momentum)
