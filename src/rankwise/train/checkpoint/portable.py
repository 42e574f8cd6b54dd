"""Model, optimizer and RNG state that does not depend on how the model is wrapped.

Built on ``torch.distributed.checkpoint.state_dict`` (DCP's ``get_model_state_dict`` and
friends), so the keys are the plain module's parameter names whatever the wrapping: no
``module.`` prefix from DDP, full (unsharded) tensors from FSDP2, everything on the CPU. A state
saved from FSDP2 on 2 ranks loads onto FSDP2 on 3 ranks, onto DDP, or onto a plain model in a
world of one, and the other way round.

Who gets what:

- plain and DDP models: every rank gets the state (nothing to gather; no communication);
- FSDP2 (sharded) models: the calls are collectives that every rank must make; rank 0 gets the
  full state and the other ranks get ``{}`` (so that N ranks never hold N full copies), unless
  ``all_ranks=True``. Loading onto a sharded model uses rank 0's state and broadcasts it, so
  the other ranks may pass ``{}``.

>>> net = torch.nn.Linear(2, 1)
>>> sorted(model_state_dict(net))
['bias', 'weight']
"""

from __future__ import annotations

import random
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DataParallel

import rankwise.distributed as rd
from rankwise.parallel.common import unwrap_model
from rankwise.parallel.fsdp import as_dtensor, is_fsdp_module

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

_RNG_KEYS = ("python", "numpy", "torch")
# torch.distributed.checkpoint is imported on first use: it doubles `import torch`'s time, and
# scripts that only touch checkpoint files (or never checkpoint) should not pay for it.


def _is_sharded(model: nn.Module) -> bool:
    if is_fsdp_module(model):
        return True
    return any(as_dtensor(p) is not None for p in model.parameters())


def in_group() -> bool:
    """Whether this process is in a process group of more than one rank."""
    return rd.has_group() and dist.get_world_size() > 1


def _to_cpu(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    if isinstance(state, dict):
        return {k: _to_cpu(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_to_cpu(v) for v in state)
    return state


def dcp_view(model: nn.Module) -> nn.Module:
    """What DCP's state-dict functions are given: DataParallel (one process; DCP would keep
    its ``module.`` prefix) is looked through, DDP and FSDP2 are not (DCP handles them)."""
    while isinstance(model, DataParallel):
        model = model.module
    return model


def _read_options(model: nn.Module, all_ranks: bool) -> StateDictOptions:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if not _is_sharded(model):
        # Already full on every rank: no gather, and cpu_offload leaves CPU tensors as they are.
        return StateDictOptions(cpu_offload=True)
    # cpu_offload with full_state_dict keeps the gathered tensors on rank 0 only.
    return StateDictOptions(full_state_dict=True, cpu_offload=not all_ranks)


def _write_options(model: nn.Module, from_rank0: bool) -> StateDictOptions:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    broadcast = in_group() and (from_rank0 or _is_sharded(model))
    return StateDictOptions(
        full_state_dict=broadcast or _is_sharded(model), broadcast_from_rank0=broadcast
    )


def model_state_dict(model: nn.Module, *, all_ranks: bool = False) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers as full CPU tensors, keyed by the plain module's names.

    A collective on every rank when the model is sharded (FSDP2); then only rank 0 gets the
    state (others get ``{}``) unless ``all_ranks``. Plain and DDP models: local, every rank.
    The tensors may share memory with the model's, as ``state_dict()``'s do: write or clone
    them before the next optimizer step.

    >>> ddp_like = torch.nn.Sequential(torch.nn.Linear(2, 1))
    >>> list(model_state_dict(ddp_like))
    ['0.weight', '0.bias']
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state: dict[str, Any] = get_model_state_dict(
        dcp_view(model), options=_read_options(model, all_ranks)
    )
    return _to_cpu(state) if all_ranks else state


def load_model_state_dict(
    model: nn.Module, state: dict[str, torch.Tensor], *, from_rank0: bool = False
) -> None:
    """Load a :func:`model_state_dict` into ``model``, whatever its wrapping and world size.

    Sharded models (FSDP2): a collective; rank 0's ``state`` is broadcast and each rank keeps
    its shard, so the other ranks may pass ``{}``. Plain and DDP models load their own
    ``state`` locally, unless ``from_rank0`` (then a collective that broadcasts rank 0's).
    Keys saved with DDP's ``module.`` prefix (a plain ``torch.save(ddp.state_dict())``) are
    accepted too. Missing or unexpected keys raise torch's ``RuntimeError`` naming them.
    """
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    options = _write_options(model, from_rank0)
    named: dict[str, Any] = _strip_module_prefix(model, state) if state else state
    set_model_state_dict(dcp_view(model), named, options=options)


def _strip_module_prefix(model: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    if not all(k.startswith("module.") for k in state):
        return state
    names = {n for n, _ in unwrap_model(model).named_parameters()}
    names |= {n for n, _ in unwrap_model(model).named_buffers()}
    if names & set(state):  # the model itself has a submodule called "module"
        return state
    return {k[len("module.") :]: v for k, v in state.items()}


def optimizer_state_dict(
    model: nn.Module, optimizer: torch.optim.Optimizer, *, all_ranks: bool = False
) -> dict[str, Any]:
    """The optimizer's state with parameters keyed by name (``"0.weight"``), full CPU tensors.

    Same rules as :func:`model_state_dict`: a collective for sharded models (rank 0 gets the
    state unless ``all_ranks``), local for plain and DDP models. An optimizer that never
    stepped is saved as its hyper-parameters alone; torch's DCP would instead initialise it
    with a zero step, which changes Adam's bias correction for the rest of the run.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    if not optimizer.state:
        return {"state": {}, "param_groups": _named_param_groups(model, optimizer)}
    state = get_optimizer_state_dict(
        dcp_view(model), optimizer, options=_read_options(model, all_ranks)
    )
    return _to_cpu(state) if all_ranks else state


def load_optimizer_state_dict(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    *,
    from_rank0: bool = False,
) -> None:
    """Load an :func:`optimizer_state_dict` into ``optimizer`` (built over ``model``'s params).

    Collective and rank-0-sourced under the same rules as :func:`load_model_state_dict`. Call
    it before the first backward or after a step (DCP's rule), e.g. right after building the
    optimizer.
    """
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    options = _write_options(model, from_rank0)
    groups = _stateless_groups(state) if not options.broadcast_from_rank0 else None
    if options.broadcast_from_rank0:
        # Every rank must take the same path below; rank 0 alone knows which.
        groups = rd.broadcast_plain(_stateless_groups(state) if rd.get_rank() == 0 else None)
    if groups is not None:
        _load_hyperparameters(model, optimizer, groups)
        return
    set_optimizer_state_dict(dcp_view(model), optimizer, state, options=options)


def _named_param_groups(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[dict]:
    names = {id(p): n for n, p in unwrap_model(model).named_parameters()}
    groups = []
    for group in optimizer.param_groups:
        missing = [i for i, p in enumerate(group["params"]) if id(p) not in names]
        if missing:
            raise ValueError(
                f"the optimizer holds parameters that are not the model's (positions {missing} "
                "of a param group); build the optimizer from model.parameters() after wrapping."
            )
        hyper = {k: v for k, v in group.items() if k != "params"}
        groups.append({**_to_cpu(hyper), "params": [names[id(p)] for p in group["params"]]})
    return groups


def _stateless_groups(state: dict[str, Any]) -> list[dict] | None:
    if not isinstance(state, dict) or "param_groups" not in state or state.get("state"):
        return None
    return list(state["param_groups"])


def _load_hyperparameters(
    model: nn.Module, optimizer: torch.optim.Optimizer, saved: list[dict]
) -> None:
    live = _named_param_groups(model, optimizer)
    if [g["params"] for g in live] != [g["params"] for g in saved]:
        raise ValueError(
            "the saved optimizer's parameter groups "
            f"{[g['params'] for g in saved]} differ from this optimizer's "
            f"{[g['params'] for g in live]}; build the optimizer with the same groups."
        )
    for group, old in zip(optimizer.param_groups, saved, strict=True):
        group.update({k: v for k, v in old.items() if k != "params"})


def rng_state() -> dict[str, Any]:
    """This process's random generator states: python ``random``, numpy's global, torch's CPU
    generator and, when CUDA is available, every CUDA device's. Plain values and tensors only.

    >>> s = rng_state(); a = torch.rand(2); set_rng_state(s); torch.equal(a, torch.rand(2))
    True
    """
    np_state = np.random.get_state(legacy=False)
    assert isinstance(np_state, dict)  # legacy=False always returns the dict form
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": [int(k) for k in np_state["state"]["key"]],
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`'s output; the same draws follow as after it was taken.

    CUDA states are restored when CUDA is available (with a warning when the device count
    differs); a state without them leaves CUDA's generators alone.
    """
    missing = [k for k in _RNG_KEYS if k not in state]
    if missing:
        raise ValueError(
            f"RNG state lacks {missing} (has {sorted(state)}); pass the dict rng_state() made."
        )
    random.setstate(_as_tuple(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": np_state["bit_generator"],
            "state": {"key": np.asarray(np_state["key"], dtype=np.uint32), "pos": np_state["pos"]},
            "has_gauss": np_state["has_gauss"],
            "gauss": np_state["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if len(cuda) != count:
            warnings.warn(
                f"the RNG state holds {len(cuda)} CUDA generators and this process sees {count} "
                "devices; restoring the first min of both.",
                stacklevel=2,
            )
        for device, generator in enumerate(cuda[:count]):
            torch.cuda.set_rng_state(generator, device)


def _as_tuple(value: Any) -> Any:
    # random.setstate needs tuples; a state that went through JSON comes back as lists.
    if isinstance(value, list | tuple):
        return tuple(_as_tuple(v) for v in value)
    return value
