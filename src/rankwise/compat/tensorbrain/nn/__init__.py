"""``torch.nn`` under TensorBrain's name, plus the guide's ``ResNet50``.

Every name is torch's (``tb.nn.CrossEntropyLoss`` is ``torch.nn.CrossEntropyLoss``) except
``ResNet50``, rankwise's own ResNet-50 (:mod:`rankwise.models`; torchvision would pull in
another torch). ``parallel`` is a real submodule, so the guide's ``from tb.nn.parallel import``
form has a module path to import from.

>>> import rankwise.compat.tensorbrain as tb
>>> import torch
>>> tb.nn.Linear is torch.nn.Linear, sum(p.numel() for p in tb.nn.ResNet50().parameters())
(True, 25557032)
"""

from __future__ import annotations

from typing import Any

import torch.nn as _torch_module

from rankwise.compat.tensorbrain.alias import forward, names
from rankwise.compat.tensorbrain.nn import parallel
from rankwise.models import ResNet50

__all__ = ["ResNet50", "parallel"]


def __getattr__(name: str) -> Any:
    return forward(_torch_module, __name__, name)


def __dir__() -> list[str]:
    return names(_torch_module, globals())
