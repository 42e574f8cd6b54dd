"""Turning the user's model, optimizer and scheduler into what the trainer steps.

Wrapping follows ``config.strategy`` (``wrap_model``: DDP with ``config.compression``, FSDP2,
or the plain module in a world of one / with ``"none"``). A model the user wrapped already
(DDP, DataParallel, FSDP2) is trained as it is: wrapping it again would nest two wrappers. FSDP2 replaces the parameters with
sharded ones, so an optimizer built before wrapping no longer points at them: it is rebuilt
with the same class and per-group settings over the new parameters (matched by name).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState
from torch.nn.parallel import DataParallel, DistributedDataParallel

import rankwise.distributed as rd
from rankwise.distributed.errors import RankwiseWarning
from rankwise.parallel import (
    DDPConfig,
    FSDPConfig,
    Precision,
    enable_gradient_checkpointing,
    unwrap_model,
    wrap_model,
)
from rankwise.parallel.compile import compile_model
from rankwise.parallel.ddp import user_hook_states
from rankwise.parallel.fsdp import is_fsdp_module
from rankwise.train.config import DistributedTrainingConfig


@dataclass
class Prepared:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    precision: Precision
    config: DistributedTrainingConfig  # a copy of the first fit's: later fits keep its wrapping

    def hand_over(self, state: Any) -> None:
        """Give the first ``fit``'s objects to the ``TrainState``, which owns the wrapper from
        then on (``--on-failure continue`` replaces it at each regroup). Only the bare module
        stays here: a kept wrapper would hold a broken group's sockets open, and a survivor
        blocked on them (one not next to the lost rank in gloo's ring) would never wake."""
        state.hold_prepared(self.model, self.optimizer, self.scheduler, self.precision)
        self.model = unwrap_model(self.model)


def prepare(
    given: nn.Module,
    optimizer: Any,
    scheduler: Any,
    cfg: DistributedTrainingConfig,
    device: torch.device,
    device_choice: torch.device | None,
) -> Prepared:
    """Wrap ``given`` (the model as the user passed it) for ``cfg.strategy`` and build the
    optimizer and scheduler over the wrapped parameters (each an instance or a factory) and
    the precision plug-in. ``device`` is where batches go; ``device_choice`` the user's own
    (None: the wrapping's default)."""
    module = unwrap_model(given)
    names = {id(p): n for n, p in module.named_parameters()}
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(module)
    model = (
        _train_as_wrapped(given, cfg, device)
        if is_wrapped(given)
        else _wrap(module, cfg, device_choice)
    )
    if cfg.compile:  # after wrapping: DDP's buckets and FSDP2's hooks are in place
        compile_model(model, cfg.compile_options)
    spec = optimizer
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
    if scheduler is not None and not hasattr(scheduler, "step"):
        scheduler = scheduler(optimizer)
    elif scheduler is not None and optimizer is not spec:
        raise ValueError(
            "the optimizer was rebuilt over the wrapped model's parameters (strategy="
            f"{cfg.strategy!r} gave new parameter objects: FSDP2 shards them), so the "
            "scheduler instance points at the old one; pass the scheduler as a callable, e.g. "
            "scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 10)."
        )
    precision = Precision(cfg.precision, device)
    return Prepared(model, optimizer, scheduler, precision, dataclasses.replace(cfg))


def resolve_device(device: torch.device | str | int) -> torch.device:
    """The trainer's ``device`` argument as a ``torch.device``; an int is a CUDA index.

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    try:
        resolved = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device ({device!r}) is not a torch device; pass 'cpu', 'cuda', 'cuda:0' or a "
            f"CUDA index ({exc})."
        ) from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device ({device!r}) is a CUDA device, but torch.cuda.is_available() is False "
            "here; pass device='cpu', or leave device out (rankwise picks this rank's device)."
        )
    return resolved


def is_wrapped(model: nn.Module) -> bool:
    return isinstance(model, DistributedDataParallel | DataParallel) or is_fsdp_module(model)


def _train_as_wrapped(
    model: nn.Module, cfg: DistributedTrainingConfig, device: torch.device
) -> nn.Module:
    """Use a model the user wrapped as it is, after checking it fits the config and world."""
    kind = type(model).__name__
    fsdp = is_fsdp_module(model)
    if cfg.compression is not None:
        raise ValueError(
            f"config.compression ({cfg.compression!r}) is applied when rankwise wraps the model, "
            f"but it came wrapped in {kind}; pass the plain module, or register the hook on "
            "your DDP yourself (model.register_comm_hook(...)) and leave compression=None."
        )
    if cfg.strategy == "none" and (fsdp or isinstance(model, DistributedDataParallel)):
        raise ValueError(
            f"config.strategy is 'none' but the model came wrapped in {kind}, which syncs "
            f"gradients across ranks; set strategy={'fsdp' if fsdp else 'ddp'!r} (the default "
            "is 'ddp') or pass the plain module to train unsynced."
        )
    if (cfg.strategy == "fsdp") != fsdp:
        raise ValueError(
            f"config.strategy is {cfg.strategy!r} but the model came wrapped in {kind}; set "
            f"strategy={'fsdp' if fsdp else 'ddp'!r} or pass the plain module."
        )
    if isinstance(model, DataParallel):
        _place_data_parallel(model, device)
    _warn_unsaved_hook_state(model)
    _check_device(model, kind, device)
    return model


def _place_data_parallel(model: DataParallel, device: torch.device) -> None:
    if rd.get_world_size() > 1:
        raise ValueError(
            f"the model is a DataParallel in a world of {rd.get_world_size()} ranks: nothing "
            "would average its gradients across ranks and they would drift apart; pass the "
            "plain module (the trainer wraps it in DDP) or a DistributedDataParallel."
        )
    if model.device_ids:  # no GPU: DataParallel is a plain call of the module
        # torch moves the module to its first GPU only when it has one; with 2+ its forward
        # requires the parameters there. Module.to() keeps the Parameters: the optimizer holds.
        _check_device(model, "DataParallel", device, want=model.src_device_obj)
        model.module.to(model.src_device_obj)


def _warn_unsaved_hook_state(model: nn.Module) -> None:
    """A PowerSGDState registered on the user's DDP is checkpointed; any other hook state is not."""
    others = [s for s in user_hook_states(model) if not isinstance(s, PowerSGDState)]
    if others:
        warnings.warn(
            f"the DDP model's comm hook state ({type(others[0]).__name__}) is not checkpointed: "
            "a resumed run starts it afresh. For PowerSGD, register torch's PowerSGDState (it "
            "is saved) or pass the plain module with compression='powersgd'.",
            RankwiseWarning,
            stacklevel=4,
        )


def _check_device(
    model: nn.Module, kind: str, device: torch.device, want: torch.device | None = None
) -> None:
    """The trainer's device (where batches go) must be the wrapped model's."""
    if want is None:
        first = next(iter(model.parameters()), None)
        if first is None:
            return
        want = first.device
    same_index = want.index is None or device.index is None or want.index == device.index
    if want.type != device.type or not same_index:
        raise ValueError(
            f"the model came wrapped in {kind} on {want}, but the trainer's device is "
            f"{device}; pass device={str(want)!r} (or leave device out and wrap the model on "
            "this rank's device), or pass the plain module and let rankwise place it."
        )


def rewrap(
    module: nn.Module, cfg: DistributedTrainingConfig, device: torch.device | None
) -> nn.Module:
    """Wrap ``module`` (unwrapped) again for the process group as it is now: after the
    survivors of a lost rank regrouped (:mod:`rankwise.train.continuing`)."""
    return _wrap(module, cfg, device)


def _wrap(
    module: nn.Module, cfg: DistributedTrainingConfig, device: torch.device | None
) -> nn.Module:
    if cfg.strategy == "none" or rd.get_world_size() == 1:
        # Batches go to rd.device() (cuda:<local_rank> under NCCL) or the trainer's device, so
        # the model must too even where nothing wraps it. Module.to() keeps the Parameter
        # objects: the optimizer stays valid.
        return module.to(device or rd.device())
    if cfg.strategy == "fsdp":
        return wrap_model(module, FSDPConfig(), strategy="fsdp", device=device)
    ddp = DDPConfig(compression=cfg.compression)
    return wrap_model(module, ddp, strategy=cfg.strategy, device=device)


def _rebuild(
    old: torch.optim.Optimizer, names: dict[int, str], params: dict[str, nn.Parameter]
) -> torch.optim.Optimizer:
    """The same optimizer class and group settings over the wrapped model's parameters."""
    if any(old.state.values()):
        raise ValueError(
            "the optimizer already holds state (it has stepped) and the model's parameters "
            "were replaced by the wrapping (FSDP2 shards them into new objects); pass the optimizer as a callable, e.g. "
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


def is_factory(obj: Any) -> bool:
    """Whether a scheduler argument is a callable ``optimizer -> scheduler`` (not one)."""
    return obj is not None and callable(obj) and not hasattr(obj, "step")
