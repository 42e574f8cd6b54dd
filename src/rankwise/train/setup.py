"""Turning the user's model, optimizer and scheduler into what the trainer steps.

Wrapping follows ``config.strategy`` (``wrap_model``: DDP with ``config.compression``, FSDP2,
or the plain module in a world of one / with ``"none"``). FSDP2 replaces the parameters with
sharded ones, so an optimizer built before wrapping no longer points at them: it is rebuilt
with the same class and per-group settings over the new parameters (matched by name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

import rankwise.distributed as rd
from rankwise.parallel import (
    DDPConfig,
    FSDPConfig,
    Precision,
    enable_gradient_checkpointing,
    wrap_model,
)
from rankwise.train.config import DistributedTrainingConfig

if TYPE_CHECKING:
    from rankwise.train.trainer import DistributedTrainer


@dataclass
class Prepared:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    precision: Precision
    strategy: str


def prepare(trainer: DistributedTrainer, cfg: DistributedTrainingConfig) -> Prepared:
    module = trainer.module
    names = {id(p): n for n, p in module.named_parameters()}
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(module)
    model = _wrap(module, cfg)
    spec = trainer._optimizer_spec
    if isinstance(spec, torch.optim.Optimizer):
        optimizer = spec
        live = {id(p) for p in model.parameters()}
        if any(id(p) not in live for g in spec.param_groups for p in g["params"]):
            optimizer = _rebuild(spec, names, dict(model.named_parameters()))
    else:
        optimizer = spec(model.parameters())
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"the optimizer factory returned {type(optimizer).__name__}, not a "
                "torch.optim.Optimizer; pass e.g. lambda params: torch.optim.AdamW(params)."
            )
    scheduler = trainer._scheduler_spec
    if scheduler is not None and not hasattr(scheduler, "step"):
        scheduler = scheduler(optimizer)
    elif scheduler is not None and optimizer is not spec:
        raise ValueError(
            "the optimizer was rebuilt over the sharded parameters (strategy='fsdp'), so the "
            "scheduler instance points at the old one; pass the scheduler as a callable, e.g. "
            "scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 10)."
        )
    return Prepared(model, optimizer, scheduler, Precision(cfg.precision), cfg.strategy)


def _wrap(module: nn.Module, cfg: DistributedTrainingConfig) -> nn.Module:
    if cfg.strategy == "none" or rd.get_world_size() == 1:
        # Batches go to rd.device() (cuda:<local_rank> under NCCL), so the model must too even
        # where nothing wraps it. Module.to() keeps the Parameter objects: the optimizer stays valid.
        return module.to(rd.device())
    if cfg.strategy == "fsdp":
        return wrap_model(module, FSDPConfig(), strategy="fsdp")
    return wrap_model(module, DDPConfig(compression=cfg.compression), strategy=cfg.strategy)


def _rebuild(
    old: torch.optim.Optimizer, names: dict[int, str], params: dict[str, nn.Parameter]
) -> torch.optim.Optimizer:
    """The same optimizer class and group settings over the wrapped model's parameters."""
    if any(old.state.values()):
        raise ValueError(
            "the optimizer already holds state (it has stepped) and the model's parameters "
            "were replaced by sharding; pass the optimizer as a callable, e.g. "
            "optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)."
        )
    groups = []
    for group in old.param_groups:
        settings = {k: v for k, v in group.items() if k != "params"}
        missing = [p for p in group["params"] if names.get(id(p)) not in params]
        if missing:
            raise ValueError(
                f"{len(missing)} optimizer parameter(s) are not parameters of the model; build "
                "the optimizer over model.parameters() or pass a callable params -> optimizer."
            )
        groups.append({**settings, "params": [params[names[id(p)]] for p in group["params"]]})
    return type(old)(groups, **old.defaults)


def scale_lr(optimizer: torch.optim.Optimizer, scheduler: Any, scale: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] *= scale
        if "initial_lr" in group:
            group["initial_lr"] *= scale
    if scheduler is not None and hasattr(scheduler, "base_lrs"):
        scheduler.base_lrs = [lr * scale for lr in scheduler.base_lrs]


def seed_everything(seed: int, rank: int) -> None:
    """Seed torch, numpy and random per rank from (seed, rank) (dropout differs per rank)."""
    import random

    state = np.random.SeedSequence(seed, spawn_key=(rank,)).generate_state(2)
    torch.manual_seed(int(state[0]))
    np.random.seed(int(state[1]))
    random.seed(int(state[0]))
