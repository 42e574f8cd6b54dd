"""The TensorBrain guide on rankwise: ``import rankwise.compat.tensorbrain as tb``.

The guide is torch's API under another name, so every name here is torch's own
(``tb.tensor``, ``tb.zeros``, ``tb.empty_like``, ``tb.float32`` ...), and so are the
submodules ``tb.optim``, ``tb.cuda``, ``tb.distributed`` and ``tb.multiprocessing``. rankwise
replaces two things: ``tb.utils.data.DistributedSampler`` is rankwise's sampler, and
``tb.nn.ResNet50()`` is rankwise's ResNet-50. Each submodule is a real module, so the guide's
``import tb.distributed as dist`` / ``from tb.nn.parallel import DataParallel`` become
``import rankwise.compat.tensorbrain.distributed as dist`` /
``from rankwise.compat.tensorbrain.nn.parallel import DataParallel``. See
docs/seeds/tensorbrain.md.

>>> import rankwise.compat.tensorbrain as tb
>>> tb.tensor([1.0, 2.0]) + tb.zeros(2)
tensor([1., 2.])
>>> tb.distributed.ReduceOp.SUM == __import__("torch").distributed.ReduceOp.SUM
True
"""

from __future__ import annotations

from typing import Any

import torch as _torch_module

from rankwise.compat.tensorbrain import cuda, distributed, multiprocessing, nn, optim, utils
from rankwise.compat.tensorbrain.alias import forward, names

__all__ = ["cuda", "distributed", "multiprocessing", "nn", "optim", "utils"]


def __getattr__(name: str) -> Any:
    return forward(_torch_module, __name__, name)


def __dir__() -> list[str]:
    return names(_torch_module, globals())
