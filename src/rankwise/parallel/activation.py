"""Gradient (activation) checkpointing over a model's blocks, and how blocks are found.

Checkpointing trades compute for memory: a checkpointed block keeps only its inputs during
the forward pass and recomputes its activations in the backward pass. rankwise uses torch's
non-reentrant ``torch.utils.checkpoint.checkpoint`` (works with DDP, FSDP2, autocast, kwargs
and inputs that need no grad) and restores the RNG state, so dropout draws the same masks when
recomputing: losses and gradients are unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from rankwise.parallel.common import unwrap_model

BlockSpec = Iterable[nn.Module] | type[nn.Module] | tuple[type[nn.Module], ...] | None


def find_blocks(model: nn.Module, blocks: BlockSpec = None) -> list[nn.Module]:
    """The repeated blocks of ``model``: what to checkpoint or shard one by one.

    ``blocks`` may list the modules, or give their type(s). By default they are the
    submodules a model names in its ``block_names`` attribute (e.g. a VAE's
    ``("encoder", "decoder")``), else the parameter-holding entries of the ``nn.ModuleList`` /
    ``nn.Sequential`` (the model itself included) that holds the most parameters, e.g. a
    transformer's ``layers``.

    >>> mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> [type(b).__name__ for b in find_blocks(mlp)]
    ['Linear', 'Linear']
    """
    inner = unwrap_model(model)
    if isinstance(blocks, type) or (
        isinstance(blocks, tuple) and blocks and all(isinstance(b, type) for b in blocks)
    ):
        types = blocks
        found = [m for m in inner.modules() if m is not inner and isinstance(m, types)]
        # Outermost only: a block nested in another block is covered by its parent.
        return [m for m in found if not any(m is not o and _contains(o, m) for o in found)]
    if blocks is not None:
        listed: list[object] = list(blocks)
        if not all(isinstance(b, nn.Module) for b in listed):
            raise TypeError(
                f"blocks must be nn.Module instances or nn.Module types, got {listed!r}."
            )
        return [b for b in listed if isinstance(b, nn.Module)]
    named = getattr(inner, "block_names", None)
    if named is not None:
        return [_named_block(inner, name) for name in named]
    containers = [m for m in inner.modules() if isinstance(m, nn.ModuleList | nn.Sequential)]
    best: list[nn.Module] = []
    best_size = 0
    for container in containers:
        members = [m for m in container.children() if _numel(m) > 0]
        size = sum(_numel(m) for m in members)
        if len(members) >= 2 and size > best_size:
            best, best_size = members, size
    return best


def enable_gradient_checkpointing(model: nn.Module, blocks: BlockSpec = None) -> list[str]:
    """Checkpoint each block of ``model`` (see :func:`find_blocks`); return their names.

    Call it on the plain module or on the wrapped one, before or after :func:`wrap_model`.
    Calling it twice is harmless. Parameters and ``state_dict`` keys are untouched, because the
    block's ``forward`` is replaced on the instance instead of wrapping it in a new module.

    >>> mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> enable_gradient_checkpointing(mlp)
    ['0', '2']
    """
    inner = unwrap_model(model)
    chosen = find_blocks(inner, blocks)
    if not chosen:
        raise ValueError(
            f"found no blocks to checkpoint in {type(inner).__name__}: it has no nn.ModuleList "
            "or nn.Sequential with two or more parameter-holding entries. Pass the modules "
            "(blocks=[model.enc, model.dec]) or their type (blocks=MyBlock)."
        )
    names = {id(m): name for name, m in inner.named_modules()}
    for block in chosen:
        if not isinstance(block.__dict__.get("forward"), _CheckpointedForward):
            block.forward = _CheckpointedForward(block)
    return [names.get(id(b), type(b).__name__) for b in chosen]


class _CheckpointedForward:
    """Stands in for ``block.forward``; a class, not a closure, so ``copy.deepcopy`` of the
    model re-points it at the copied block (a closure would keep running the original)."""

    def __init__(self, block: nn.Module) -> None:
        self.block = block

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The class's forward, not the instance attribute (that is this object).
        forward = type(self.block).forward.__get__(self.block)
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)  # evaluation: nothing to save, nothing to recompute
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def _named_block(model: nn.Module, name: str) -> nn.Module:
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise ValueError(
            f"{type(model).__name__}.block_names names {name!r}, which is not a submodule of "
            f"it; list names of its submodules (e.g. {[n for n, _ in model.named_children()]})."
        ) from None


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _contains(outer: nn.Module, inner: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())
