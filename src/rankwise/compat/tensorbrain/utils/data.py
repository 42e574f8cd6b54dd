"""``torch.utils.data`` under TensorBrain's name, with rankwise's ``DistributedSampler``.

``tb.utils.data.DataLoader``, ``Dataset``, ``TensorDataset`` ... are torch's;
``DistributedSampler`` is :class:`rankwise.data.DistributedSampler` (torch's arguments and
padding rule, plus an O(1)-memory shuffle and a resumable ``state_dict``).

>>> import rankwise.compat.tensorbrain as tb
>>> sampler = tb.utils.data.DistributedSampler(range(10), num_replicas=2, rank=1, shuffle=False)
>>> list(sampler)
[1, 3, 5, 7, 9]
"""

from __future__ import annotations

from typing import Any

import torch.utils.data as _torch_module

from rankwise.compat.tensorbrain.alias import forward, names
from rankwise.data import DistributedSampler

__all__ = ["DistributedSampler"]


def __getattr__(name: str) -> Any:
    return forward(_torch_module, __name__, name)


def __dir__() -> list[str]:
    return names(_torch_module, globals())
