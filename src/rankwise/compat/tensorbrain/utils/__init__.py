"""``torch.utils`` under TensorBrain's name; ``data`` is rankwise's alias module
(:mod:`rankwise.compat.tensorbrain.utils.data`, with rankwise's ``DistributedSampler``)."""

from __future__ import annotations

from typing import Any

import torch.utils as _torch_module

from rankwise.compat.tensorbrain.alias import forward, names
from rankwise.compat.tensorbrain.utils import data

__all__ = ["data"]


def __getattr__(name: str) -> Any:
    return forward(_torch_module, __name__, name)


def __dir__() -> list[str]:
    return names(_torch_module, globals())
