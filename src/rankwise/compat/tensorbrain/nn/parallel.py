"""``torch.nn.parallel`` under TensorBrain's name; ``DataParallel`` and
``DistributedDataParallel`` are torch's.

The guide's ``from tb.nn.parallel import DistributedDataParallel as DDP`` becomes
``from rankwise.compat.tensorbrain.nn.parallel import DistributedDataParallel as DDP``.
"""

from __future__ import annotations

from typing import Any

import torch.nn.parallel as _torch_module

from rankwise.compat.tensorbrain.alias import forward, names


def __getattr__(name: str) -> Any:
    return forward(_torch_module, __name__, name)


def __dir__() -> list[str]:
    return names(_torch_module, globals())
