"""rankwise: data-parallel distributed training on PyTorch.

Subpackages, lowest layer first (a module imports only from layers above it in this list):

- :mod:`rankwise.distributed` — process group life cycle and collectives
- :mod:`rankwise.data` — who sees which sample, in which order
- :mod:`rankwise.augment` — deterministic per-sample augmentation
- :mod:`rankwise.parallel` — wrapping a model for N ranks
"""

from rankwise import distributed

__version__ = "0.1.0"

__all__ = ["__version__", "distributed"]
