"""``torch.distributed`` under TensorBrain's name: ``import rankwise.compat.tensorbrain.distributed as dist``
replaces ``import tb.distributed as dist``; ``dist.init_process_group``, ``dist.all_reduce``,
``dist.ReduceOp`` ... are torch's own."""

from __future__ import annotations

from typing import Any

import torch.distributed as _torch_module

from rankwise.compat.tensorbrain.alias import forward, names


def __getattr__(name: str) -> Any:
    return forward(_torch_module, __name__, name)


def __dir__() -> list[str]:
    return names(_torch_module, globals())
