"""rankwise: data-parallel distributed training on PyTorch.

Subpackages, lowest layer first (a module imports only from layers above it in this list):

- :mod:`rankwise.distributed` — process group life cycle and collectives
- :mod:`rankwise.data` — who sees which sample, in which order
- :mod:`rankwise.augment` — deterministic per-sample augmentation
- :mod:`rankwise.parallel` — wrapping a model for N ranks

``import rankwise`` loads only ``rankwise.distributed``; the others load on first use
(``rankwise.data.DistributedSampler`` works without importing ``rankwise.data`` first).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from rankwise import distributed

__version__ = "0.1.0"

_LAZY = ("data", "augment", "parallel", "testing")

__all__ = ["__version__", "augment", "data", "distributed", "parallel", "testing"]


def __getattr__(name: str) -> ModuleType:
    if name in _LAZY:
        return importlib.import_module(f"rankwise.{name}")
    raise AttributeError(f"module 'rankwise' has no attribute {name!r}")
