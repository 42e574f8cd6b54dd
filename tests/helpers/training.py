"""The small models, data sets and trainers the tests build: one definition each, so that a
test says only what differs (the layer sizes, the seed, the optimizer).

>>> model = mlp(6, 16, 3, seed=1)
>>> [type(m).__name__ for m in model]
['Linear', 'Tanh', 'Linear']
>>> x, y = classification(8, 6, 3, seed=1)
>>> tuple(x.shape), tuple(y.shape), int(y.max()) < 3
((8, 6), (8,), True)
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import torch
from torch import nn

from rankwise.train import DistributedTrainer

__all__ = ["ADAM", "CROSS_ENTROPY", "classification", "make_trainer", "mlp", "separable"]

CROSS_ENTROPY = nn.CrossEntropyLoss()  # stateless: one instance serves every trainer
ADAM = functools.partial(torch.optim.Adam, lr=1e-2)  # a factory: the trainer builds it (FSDP2)


def mlp(
    *sizes: int,
    seed: int | None = 0,
    activation: type[nn.Module] = nn.Tanh,
    dropout: float | None = None,
) -> nn.Sequential:
    """Linear layers through ``sizes`` (default ``6, 16, 16, 3``) with ``activation`` between
    them, built after ``torch.manual_seed(seed)`` (None: the global generator as it is), so
    every rank that builds it gets the same weights; ``dropout``: a ``Dropout`` after the
    first activation."""
    sizes = sizes or (6, 16, 16, 3)
    if len(sizes) < 2:
        raise ValueError(f"mlp needs an input and an output size, got {sizes}.")
    if seed is not None:
        torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (into, out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(into, out))
        if i < len(sizes) - 2:
            layers.append(activation())
            if i == 0 and dropout is not None:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def classification(
    rows: int | tuple[int, ...], features: int, classes: int, *, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random features and class labels, reproducible: ``randn(*rows, features)`` then
    ``randint(0, classes, rows)`` from one generator seeded ``seed``."""
    shape = (rows,) if isinstance(rows, int) else tuple(rows)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, features, generator=g)
    return x, torch.randint(0, classes, shape, generator=g)


def separable(rows: int, features: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random features and a label a model can learn from them (whether the first three
    features sum above zero): a loss that falls."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, features, generator=g)
    return x, (x[:, :3].sum(1) > 0).long()


def make_trainer(
    model: nn.Module | None = None,
    optimizer: Any = None,
    *,
    loss: nn.Module | None = CROSS_ENTROPY,
    **kwargs: Any,
) -> DistributedTrainer:
    """A :class:`DistributedTrainer` of ``model`` (default ``nn.Linear(2, 2)``) with ``loss``
    (cross-entropy by default; None: the trainer's own "no loss function") and ``optimizer``
    (an optimizer or a factory of one, as the trainer takes; default SGD at lr 0.1);
    ``kwargs`` go to the trainer (``callbacks``, ...)."""
    model = nn.Linear(2, 2) if model is None else model
    if optimizer is None:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return DistributedTrainer(model, loss, optimizer, **kwargs)
