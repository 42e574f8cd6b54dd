"""Sharded data parallelism with FSDP2 (``torch.distributed.fsdp.fully_shard``).

Each rank keeps 1/N of every parameter, gradient and optimizer state; a block's parameters
are all-gathered just before it runs and its gradients reduce-scattered after its backward.
Parameters become ``DTensor`` s sharded on dim 0, so build the optimizer *after* wrapping.

A world of one has no process group and nothing to shard: :func:`shard_model` then warns and
returns the module unchanged (use :class:`rankwise.parallel.Precision` for bf16 compute there),
rather than create a one-rank group behind the caller's back.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

import rankwise.distributed as rd
from rankwise.distributed.errors import RankwiseWarning
from rankwise.parallel.activation import find_blocks
from rankwise.parallel.common import DTYPES

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy


@dataclasses.dataclass
class FSDPConfig:
    """How FSDP2 shards and casts; checked on construction and by :func:`shard_model`.

    - ``param_dtype``: compute dtype of the all-gathered parameters (``"bf16"``, ``"fp16"``,
      ``"fp32"``); ``None`` keeps the parameters' own dtype (no mixed precision).
    - ``reduce_dtype``: dtype of the gradient reduce-scatter. ``None`` means ``"fp32"`` when
      ``param_dtype`` is set: summing low-precision gradients across ranks loses accuracy, so
      rankwise only halves that traffic when you ask (``reduce_dtype="bf16"``).
    - ``reshard_after_forward``: free gathered parameters after forward (less memory, one
      more all-gather in backward).
    - ``broadcast_parameters``: copy rank 0's parameters and buffers to every rank before
      sharding (``fully_shard`` itself keeps each rank's own values).
    - ``block_types``: the module types to shard one by one; ``None`` finds the blocks as
      :func:`rankwise.parallel.find_blocks` does. The root is always sharded last.

    >>> FSDPConfig(param_dtype="bf16").policy().reduce_dtype
    torch.float32
    """

    param_dtype: str | None = None
    reduce_dtype: str | None = None
    reshard_after_forward: bool = True
    broadcast_parameters: bool = True
    block_types: tuple[type[nn.Module], ...] | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> FSDPConfig:
        for name in ("param_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value is not None and value not in DTYPES:
                raise ValueError(
                    f"FSDPConfig.{name} ({value!r}) is not supported; use None, 'fp32', "
                    "'bf16' or 'fp16'."
                )
        for name in ("reshard_after_forward", "broadcast_parameters"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"FSDPConfig.{name} ({getattr(self, name)!r}) must be a bool.")
        if self.block_types is not None and not (
            isinstance(self.block_types, tuple)
            and all(isinstance(t, type) and issubclass(t, nn.Module) for t in self.block_types)
        ):
            raise ValueError(
                f"FSDPConfig.block_types ({self.block_types!r}) must be a tuple of nn.Module "
                "subclasses, e.g. (TransformerBlock,)."
            )
        return self

    def policy(self) -> MixedPrecisionPolicy:
        """The FSDP2 mixed-precision policy these fields describe."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.param_dtype is None and self.reduce_dtype is None:
            return MixedPrecisionPolicy()
        reduce = self.reduce_dtype or "fp32"
        return MixedPrecisionPolicy(
            param_dtype=DTYPES[self.param_dtype] if self.param_dtype else None,
            reduce_dtype=DTYPES[reduce],
        )


def shard_model(
    model: nn.Module,
    config: FSDPConfig | None = None,
    device: torch.device | str | None = None,
) -> nn.Module:
    """Apply ``fully_shard`` to each block of ``model`` and then to the model; return it.

    The returned object is ``model`` itself (FSDP2 changes its class in place). Under NCCL
    the model goes to ``cuda:<local_rank>``; otherwise it stays on (or moves to) ``device``.
    """
    from torch.distributed.fsdp import fully_shard

    cfg = (config if config is not None else FSDPConfig()).validate()
    if device is not None:
        model = model.to(torch.device(device))
    if not rd.has_group():
        warnings.warn(
            "strategy='fsdp' in a world of one (no process group): nothing to shard, so the "
            "model is returned unwrapped. For bf16 compute use rankwise.parallel."
            "Precision('bf16'); launch with `rankwise launch --nproc-per-node=N` to shard.",
            RankwiseWarning,
            stacklevel=3,
        )
        return model
    if device is None and rd.device().type == "cuda":
        device = rd.device()
        model = model.to(device)
    device_type = torch.device(device).type if device is not None else "cpu"
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    if cfg.broadcast_parameters:
        _broadcast_from_rank0(model)
    policy = cfg.policy()
    for block in find_blocks(model, cfg.block_types):
        fully_shard(
            block, mesh=mesh, reshard_after_forward=cfg.reshard_after_forward, mp_policy=policy
        )
    fully_shard(model, mesh=mesh, reshard_after_forward=cfg.reshard_after_forward, mp_policy=policy)
    return model


@torch.no_grad()
def _broadcast_from_rank0(model: nn.Module) -> None:
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)


def is_fsdp_module(obj: object) -> bool:
    """Whether ``obj`` was sharded by FSDP2, without importing FSDP (about 0.6 s) to find out:
    if ``torch.distributed.fsdp`` was never imported, nothing can have been sharded."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(obj, fsdp.FSDPModule)


def as_dtensor(obj: object) -> torch.distributed.tensor.DTensor | None:
    """``obj`` if it is a DTensor, else ``None``; imports nothing (see :func:`is_fsdp_module`)."""
    tensor_mod = sys.modules.get("torch.distributed.tensor")
    return obj if tensor_mod is not None and isinstance(obj, tensor_mod.DTensor) else None
