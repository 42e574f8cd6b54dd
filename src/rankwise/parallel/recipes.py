"""Pieces for the explicit, step-by-step training style of :class:`ExplicitDDP`.

- :class:`OptimizerRecipe`: a torch optimizer described before its model exists (``Adam, lr``),
  built over the first parameters it is given and then bound to them. Where a step takes "an
  optimizer" (:meth:`ExplicitDDP.step`, :class:`rankwise.train.DistributedTrainer`, which takes
  any callable ``params -> optimizer``), a recipe works too.
- :class:`OutputGradientMixin`: mixed into a torch loss class, it remembers the last
  ``forward``'s predictions and loss, and ``backward(loss)`` returns d loss / d predictions:
  the ``grad_output`` that :meth:`ExplicitDDP.backward` takes.

>>> class MSE(OutputGradientMixin, nn.MSELoss): ...
>>> loss_fn, predictions = MSE(), torch.tensor([1.0, 3.0], requires_grad=True)
>>> loss = loss_fn(predictions, torch.zeros(2))       # mean of 1 and 9
>>> loss_fn.backward(loss)                             # 2 * predictions / 2
tensor([1., 3.])
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["OptimizerRecipe", "OutputGradientMixin", "as_optimizer"]


class OptimizerRecipe:
    """``optimizer_class(params, lr=lr, **options)``, built over the first ``params`` it is
    given (:meth:`bind`, or a call) and bound to them after: binding it to another model's
    parameters is an error, so one recipe never drives two models by accident.

    >>> recipe = OptimizerRecipe(torch.optim.SGD, lr=0.1, momentum=0.9)
    >>> net = nn.Linear(2, 1)
    >>> optimizer = recipe.bind(net.parameters())
    >>> type(optimizer).__name__, optimizer.param_groups[0]["lr"], recipe(net.parameters()) is optimizer
    ('SGD', 0.1, True)
    """

    # How error messages name the learning rate (an adapter may call it otherwise).
    lr_name = "lr"

    def __init__(
        self, optimizer_class: type[torch.optim.Optimizer], lr: float, **options: Any
    ) -> None:
        if not (
            isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)
        ):
            raise TypeError(
                f"optimizer_class must be a torch.optim.Optimizer subclass such as "
                f"torch.optim.Adam, got {optimizer_class!r}."
            )
        if (
            isinstance(lr, bool)
            or not isinstance(lr, int | float)
            or not math.isfinite(lr)
            or lr <= 0
        ):
            raise ValueError(
                f"{type(self).__name__} {self.lr_name} ({lr!r}) must be a finite number > 0, "
                "e.g. 0.001."
            )
        self.optimizer_class = optimizer_class
        self.lr = float(lr)
        self.options = options
        self.optimizer: torch.optim.Optimizer | None = None

    def bind(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        """The torch optimizer over ``params``: built on the first call, the same one after."""
        params = list(params)
        if self.optimizer is None:
            build: Any = self.optimizer_class  # Optimizer's own __init__ takes no lr
            self.optimizer = build(params, lr=self.lr, **self.options)
            return self.optimizer
        bound = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        if {id(p) for p in params} != bound:
            raise ValueError(
                f"this {type(self).__name__} is already bound to another model's parameters; "
                f"create one {type(self).__name__} per model."
            )
        return self.optimizer

    # A trainer that takes a callable params -> optimizer takes a recipe.
    __call__ = bind

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({self.optimizer_class.__name__}, lr={self.lr}{options})"


def as_optimizer(
    optimizer: torch.optim.Optimizer | OptimizerRecipe, params: Iterable[nn.Parameter]
) -> torch.optim.Optimizer:
    """``optimizer`` itself, or a recipe bound to ``params``."""
    return optimizer.bind(params) if isinstance(optimizer, OptimizerRecipe) else optimizer


class OutputGradientMixin:
    """Mix into a torch loss class (``class L(OutputGradientMixin, nn.CrossEntropyLoss)``):
    each ``forward(predictions, target)`` is remembered, and :meth:`backward` gives the
    gradient of a loss with respect to those predictions.

    Pass the loss as you scaled it (``loss / accumulation_steps``) and the scale reaches the
    gradient; with no argument, the loss the last forward returned is used.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = super().forward(input, target)  # type: ignore[misc]
        self._last = (input, loss)
        return loss

    def backward(self, loss: torch.Tensor | None = None) -> torch.Tensor:
        """d ``loss`` (default: what the last ``forward`` returned) / d that forward's
        predictions."""
        if loss is not None and not isinstance(loss, torch.Tensor):
            hint = (
                "a literal `...` (the placeholder guides use for elided arguments)"
                if loss is Ellipsis
                else f"a {type(loss).__name__}"
            )
            raise TypeError(
                f"{type(self).__name__}.backward() takes the loss tensor forward() returned, "
                f"got {hint}; pass it scaled as you need: loss_fn.backward(loss)."
            )
        if self._last is None or not self._last[0].requires_grad:
            raise RuntimeError(
                f"{type(self).__name__}.backward() needs a forward(output, target) on an output "
                "that requires grad (a training forward) first."
            )
        predictions, last_loss = self._last
        (grad,) = torch.autograd.grad(last_loss if loss is None else loss, predictions)
        return grad
