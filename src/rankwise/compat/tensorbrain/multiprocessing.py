"""``torch.multiprocessing`` under TensorBrain's name: ``tb.multiprocessing.spawn`` is torch's."""

from __future__ import annotations

from typing import Any

import torch.multiprocessing as _torch_module

from rankwise.compat.tensorbrain.alias import forward, names


def __getattr__(name: str) -> Any:
    return forward(_torch_module, __name__, name)


def __dir__() -> list[str]:
    return names(_torch_module, globals())
