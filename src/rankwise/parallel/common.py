"""Small pieces the parallel modules share: unwrapping a model, the precision names."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

# A context that does nothing, shared (nullcontext is reusable): hot paths build none per step.
NO_OP = contextlib.nullcontext()

# Precision names as users write them, for Precision modes and FSDP's mixed-precision policy.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP / DataParallel wrapper (FSDP2 modules are their own)."""
    while isinstance(model, DistributedDataParallel | DataParallel):
        model = model.module
    return model
