"""The CyxWiz guide's model-building names, on torch: ``cx.SequentialModel``, ``cx.LinearModule``,
``cx.ReLUModule``, ``cx.CrossEntropyLoss``, ``cx.AdamOptimizer`` (and ``cx.SGDOptimizer``).

Modules are torch modules (``LinearModule`` *is* ``torch.nn.Linear``), so they go anywhere
torch's do. The guide builds its optimizer before any parameters exist
(``cx.AdamOptimizer(0.001)``), so an optimizer here is a
:class:`rankwise.parallel.OptimizerRecipe` that builds the torch optimizer the first time it is
given parameters (by the trainer, or by ``DistributedDataParallel.update_parameters``) and is
then bound to them; ``CrossEntropyLoss.backward`` is
:class:`rankwise.parallel.OutputGradientMixin`'s.

>>> import rankwise.compat.cyxwiz as cx
>>> model = cx.SequentialModel()
>>> model.add(cx.LinearModule(4, 8)).add(cx.ReLUModule()).add(cx.LinearModule(8, 2))
SequentialModel(...)
>>> adam = cx.AdamOptimizer(0.001)
>>> type(adam.bind(model.parameters())).__name__, adam.bind(model.parameters()) is adam.optimizer
('Adam', True)
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from rankwise.parallel.recipes import OptimizerRecipe, OutputGradientMixin
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


class CrossEntropyLoss(OutputGradientMixin, nn.CrossEntropyLoss):
    """torch's cross-entropy (mean over the batch) with the guide's ``forward`` / ``backward``
    pair: ``backward(loss)`` is d ``loss`` / d predictions of the last ``forward``
    (:class:`rankwise.parallel.OutputGradientMixin`)."""


class AdamOptimizer(OptimizerRecipe):
    """The guide's ``cx.AdamOptimizer(learning_rate)``: a :class:`rankwise.parallel.OptimizerRecipe`
    for ``torch.optim.Adam(params, lr=learning_rate, betas=(beta1, beta2), eps=epsilon)``."""

    lr_name = "learning_rate"

    def __init__(
        self,
        learning_rate: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
    ) -> None:
        super().__init__(torch.optim.Adam, learning_rate, betas=(beta1, beta2), eps=epsilon)


class SGDOptimizer(OptimizerRecipe):
    """``torch.optim.SGD(params, lr=learning_rate, momentum=momentum)`` as a recipe (not in the
    guide's Quick Start; its update is linear in the gradient, which makes equivalences
    checkable)."""

    lr_name = "learning_rate"

    def __init__(self, learning_rate: float = 0.01, momentum: float = 0.0) -> None:
        super().__init__(torch.optim.SGD, learning_rate, momentum=momentum)
