"""Counting the calls a piece of code makes into torch: a regression guard that load cannot move.

>>> import torch
>>> t, calls = torch.arange(3.0), TorchCalls()
>>> with calls:
...     calls.on = True
...     _ = t.sum().item()         # .item(): a host read, a device sync on a GPU
>>> dict(calls.calls)
{'Tensor.sum': 1, 'Tensor.item': 1}
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch.overrides import TorchFunctionMode


class TorchCalls(TorchFunctionMode):
    """Tallies top-level calls into the torch API by name while ``on`` is true.

    torch runs each call with the mode switched off, so what a call does inside is not counted
    again: the tally is the code's own calls (``Tensor.item``, ``torch.nn.functional.linear``,
    ``Tensor.shape`` for a property), the same on every run.
    """

    def __init__(self) -> None:
        super().__init__()
        self.on = False
        self.calls: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.on:
            self.calls[call_name(func)] += 1
        return func(*args, **(kwargs or {}))


def call_name(func: Any) -> str:
    """``Tensor.argmax``, ``Tensor.shape`` (a property's getter), ``torch.nn.functional.linear``."""
    descriptor = getattr(func, "__self__", None)
    if hasattr(descriptor, "__objclass__"):  # Tensor.shape.__get__ and friends
        func = descriptor
    owner = getattr(func, "__objclass__", None)
    name = f"{owner.__name__}.{func.__name__}" if owner is not None else func.__qualname__
    module = getattr(func, "__module__", None) or ""
    name = name.replace("TensorBase.", "Tensor.")  # methods written in C report torch's base
    return name if name.startswith("Tensor.") or not module else f"{module}.{name}"
