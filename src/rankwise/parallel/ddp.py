"""Wrapping a model for N ranks: :class:`DDPConfig`, :func:`wrap_model`, :func:`accumulate`.

rankwise configures torch's engines rather than replacing them: ``"ddp"`` is
``torch.nn.parallel.DistributedDataParallel`` (buckets, overlap, ``no_sync``, comm hooks),
``"fsdp"`` is FSDP2 ``fully_shard`` (see :mod:`rankwise.parallel.fsdp`), ``"dp"`` is
``torch.nn.DataParallel``. The training loop is the same with or without ranks::

    model = wrap_model(net, DDPConfig(compression="bf16"))
    for i, (x, y) in enumerate(batches):
        with accumulate(model, is_last=is_sync_step(i, 4, len(batches))):
            (loss_fn(model(x), y) / 4).backward()
        if is_sync_step(i, 4, len(batches)):
            optimizer.step()
            optimizer.zero_grad()
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as _powersgd
from torch.nn.parallel import DataParallel, DistributedDataParallel

import rankwise.distributed as rd
from rankwise.distributed.errors import RankwiseWarning
from rankwise.parallel import hooks
from rankwise.parallel.common import NO_OP
from rankwise.parallel.fsdp import FSDPConfig, is_fsdp_module, shard_model
from rankwise.parallel.sync_check import structure_mismatch

STRATEGIES = ("ddp", "fsdp", "dp", "none")
COMPRESSIONS = (None, "fp16", "bf16", "powersgd")
_STATE_ATTR = "_rankwise_hook_state"


@dataclasses.dataclass
class DDPConfig:
    """How DDP synchronises gradients; checked on construction and again by :func:`wrap_model`.

    Mutable on purpose, like the CyxWiz guide's ``DDPConfig()`` whose fields are set one by one.

    - ``bucket_size_mb``: gradients are all-reduced in buckets of about this size, overlapping
      with the rest of the backward pass (DDP's ``bucket_cap_mb``).
    - ``broadcast_parameters``: every rank starts from rank 0's parameters and buffers. Turn off
      only when you have made them equal yourself (DDP's ``init_sync``).
    - ``broadcast_buffers``: re-broadcast rank 0's buffers (BatchNorm statistics) at every
      forward (DDP's ``forward_sync_buffers``).
    - ``find_unused_parameters``: needed when some parameters get no gradient in a step.
    - ``static_graph``: the set of used parameters never changes (faster, and allows
      checkpointing with ``find_unused_parameters``).
    - ``gradient_as_bucket_view``: ``.grad`` tensors alias the buckets (saves one copy).
    - ``compression``: ``None``, ``"fp16"``, ``"bf16"`` (half the bytes) or ``"powersgd"``
      (rank-``powersgd_rank`` factors after ``powersgd_start_iter`` plain steps).
    - ``count_bytes``: tally payload bytes (:func:`comm_stats`) even without compression, by
      replacing DDP's built-in all-reduce with an equivalent Python hook.

    >>> DDPConfig(compression="powersgd", powersgd_rank=2).compression
    'powersgd'
    >>> DDPConfig(bucket_size_mb=0)
    Traceback (most recent call last):
    ...
    ValueError: DDPConfig.bucket_size_mb (0) must be > 0, e.g. 25 (DDP's default).
    """

    bucket_size_mb: float = 25
    broadcast_parameters: bool = True
    broadcast_buffers: bool = True
    find_unused_parameters: bool = False
    static_graph: bool = False
    gradient_as_bucket_view: bool = True
    compression: str | None = None
    powersgd_rank: int = 1
    powersgd_start_iter: int = 10
    count_bytes: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> DDPConfig:
        """Check every field; raise ``ValueError`` naming the value and the fix."""
        size = self.bucket_size_mb
        if isinstance(size, bool) or not isinstance(size, int | float) or not size > 0:
            raise ValueError(
                f"DDPConfig.bucket_size_mb ({size!r}) must be > 0, e.g. 25 (DDP's default)."
            )
        for name in (
            "broadcast_parameters",
            "broadcast_buffers",
            "find_unused_parameters",
            "static_graph",
            "gradient_as_bucket_view",
            "count_bytes",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"DDPConfig.{name} ({getattr(self, name)!r}) must be True or False."
                )
        if isinstance(self.compression, str) and self.compression.lower() == "none":
            self.compression = None
        if isinstance(self.compression, str):
            self.compression = self.compression.lower()
        if self.compression not in COMPRESSIONS:
            raise ValueError(
                f"DDPConfig.compression ({self.compression!r}) is not supported; use None, "
                "'fp16', 'bf16' or 'powersgd'."
            )
        _require_int("powersgd_rank", self.powersgd_rank, 1, "e.g. 1, 2 or 4")
        _require_int(
            "powersgd_start_iter",
            self.powersgd_start_iter,
            2,
            "torch's PowerSGD needs two plain all-reduce steps before compressing",
        )
        return self


def _require_int(name: str, value: Any, low: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"DDPConfig.{name} ({value!r}) must be an integer >= {low} ({hint}).")


def wrap_model(
    model: nn.Module,
    config: DDPConfig | FSDPConfig | None = None,
    strategy: str = "ddp",
    device: torch.device | str | None = None,
) -> nn.Module:
    """Wrap ``model`` for data-parallel training and return the module to train.

    - ``"ddp"``: ``DistributedDataParallel`` configured by ``config`` (a :class:`DDPConfig`),
      with the compression hook registered. With no process group (a world of one) the model
      is returned as it is: it computes exactly what DDP would, and :func:`accumulate` is a
      no-op on it.
    - ``"fsdp"``: FSDP2 ``fully_shard`` configured by an :class:`FSDPConfig`; see
      :func:`rankwise.parallel.fsdp.shard_model` (a world of one returns the module).
    - ``"dp"``: ``DataParallel`` over all GPUs of this process when there are 2 or more;
      otherwise a warning and the model unchanged.
    - ``"none"``: the model unchanged.

    ``device``: where the model goes first. ``None`` keeps it where it is, except under NCCL,
    where it goes to ``cuda:<local_rank>`` (the GPU DDP reduces on).

    >>> net = nn.Linear(4, 2)
    >>> wrap_model(net) is net          # no process group: a world of one
    True
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy ({strategy!r}) is not supported; use one of {STRATEGIES}.")
    if not isinstance(model, nn.Module):
        raise TypeError(f"wrap_model needs a torch.nn.Module, got {type(model).__name__}.")
    if isinstance(model, DistributedDataParallel | DataParallel) or is_fsdp_module(model):
        raise ValueError(
            f"the model is already wrapped ({type(model).__name__}); pass the plain module, or "
            "unwrap it with rankwise.parallel.unwrap_model(model)."
        )
    if strategy == "fsdp":
        if config is not None and not isinstance(config, FSDPConfig):
            raise TypeError(
                f"strategy='fsdp' takes an FSDPConfig, got {type(config).__name__}; pass "
                "FSDPConfig(...) or leave config out."
            )
        return shard_model(model, config, device)
    if isinstance(config, FSDPConfig):
        raise TypeError(
            f"an FSDPConfig was passed with strategy={strategy!r}; use strategy='fsdp'."
        )
    cfg = (config if config is not None else DDPConfig()).validate()
    target = _target_device(device)
    if target is not None:
        model = model.to(target)
    if strategy == "none":
        return model
    if strategy == "dp":
        return _data_parallel(model)
    if not rd.has_group():
        return model
    return _ddp(model, cfg, target)


def _target_device(device: torch.device | str | None) -> torch.device | None:
    if device is not None:
        return torch.device(device)
    dev = rd.device()  # cuda:<local_rank> whenever NCCL is in the backend ("cpu:gloo,cuda:nccl")
    return dev if dev.type == "cuda" else None


def _data_parallel(model: nn.Module) -> nn.Module:
    if rd.get_world_size() > 1:
        raise ValueError(
            f"strategy='dp' runs one process over several GPUs, but this is one of "
            f"{rd.get_world_size()} ranks; use strategy='ddp' (one rank per GPU)."
        )
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        warnings.warn(
            f"strategy='dp' needs 2 or more CUDA devices and this machine has {gpus}; the model "
            "is returned unwrapped. For several CPU processes use strategy='ddp' under "
            "`rankwise launch`.",
            RankwiseWarning,
            stacklevel=3,
        )
        return model
    return DataParallel(model.to(torch.device("cuda", 0)))


def _ddp(model: nn.Module, cfg: DDPConfig, target: torch.device | None) -> nn.Module:
    first = next(model.parameters(), None)
    where = target or (first.device if first is not None else torch.device("cpu"))
    # A single-device CUDA module needs device_ids; CPU modules must pass None.
    device_ids = None
    if where.type == "cuda":
        device_ids = [where.index if where.index is not None else torch.cuda.current_device()]
    if not cfg.broadcast_parameters:
        # init_sync=False also skips DDP's check that every rank holds the same parameter
        # shapes; a mismatch then aborts a rank inside gloo. Check here and say what differs.
        problem = structure_mismatch(list(model.named_parameters()), rd.get_world_size(), where)
        if problem is not None:
            raise ValueError(f"broadcast_parameters=False, but {problem}")
    ddp = DistributedDataParallel(
        model,
        device_ids=device_ids,
        init_sync=cfg.broadcast_parameters,
        **_buffer_sync_kwarg(cfg.broadcast_buffers),
        bucket_cap_mb=cfg.bucket_size_mb,
        find_unused_parameters=cfg.find_unused_parameters,
        static_graph=cfg.static_graph,
        gradient_as_bucket_view=cfg.gradient_as_bucket_view,
    )
    if cfg.compression is not None or cfg.count_bytes:
        state = hooks.HookState()
        if cfg.compression == "powersgd":
            state.powersgd = _powersgd.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=cfg.powersgd_rank,
                start_powerSGD_iter=cfg.powersgd_start_iter,
                random_seed=0,  # identical on every rank: all must draw the same projections
            )
        ddp.register_comm_hook(state, hooks.HOOKS[cfg.compression])
        setattr(ddp, _STATE_ATTR, state)
    return ddp


def _buffer_sync_kwarg(enabled: bool) -> dict[str, Any]:
    # torch 2.13 renamed broadcast_buffers to forward_sync_buffers and warns on the old name.
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    return {
        "forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers": enabled
    }


def comm_stats(model: nn.Module) -> hooks.CommStats | None:
    """Payload bytes this rank all-reduced for gradients, or ``None`` when nothing counts them.

    Counting happens whenever a rankwise hook is registered: with any ``compression``, or with
    ``DDPConfig(count_bytes=True)``.
    """
    state = getattr(model, _STATE_ATTR, None)
    return state.stats if state is not None else None


def comm_state_dict(model: nn.Module) -> dict[str, Any]:
    """Checkpointable compression state, identical on every rank (rank 0 may save it).

    For PowerSGD: the iteration counter and the projection RNG. The per-rank error-feedback
    residuals are not included; see :func:`rankwise.parallel.hooks.powersgd_state_dict`. The
    PowerSGD state is rankwise's (``compression='powersgd'``) or the ``PowerSGDState`` a user
    registered on their own DDP (``model.register_comm_hook(state, powerSGD_hook)``).
    """
    powersgd = _powersgd_state(model)
    return {} if powersgd is None else {"powersgd": hooks.powersgd_state_dict(powersgd)}


def load_comm_state_dict(model: nn.Module, state: dict[str, Any]) -> None:
    """Restore :func:`comm_state_dict`'s output; a no-op for an empty dict."""
    if "powersgd" in state:
        live = _powersgd_state(model)
        if live is None:
            raise ValueError(
                "the saved state is PowerSGD's but this model has no PowerSGD hook; wrap it "
                "with DDPConfig(compression='powersgd') before loading."
            )
        hooks.load_powersgd_state_dict(live, state["powersgd"])


def user_hook_states(model: nn.Module) -> list[object]:
    """The states of comm hooks registered on ``model`` (a DDP) other than rankwise's own.

    DDP keeps ``(hook, state)`` of each ``register_comm_hook`` call in ``_comm_hooks`` (torch
    has no public getter); a plain module or FSDP gives ``[]``.
    """
    return [
        state
        for _, state in getattr(model, "_comm_hooks", [])
        if state is not None and not isinstance(state, hooks.HookState)
    ]


def _powersgd_state(model: nn.Module) -> _powersgd.PowerSGDState | None:
    own = getattr(model, _STATE_ATTR, None)
    if own is not None and own.powersgd is not None:
        return own.powersgd
    found = [s for s in user_hook_states(model) if isinstance(s, _powersgd.PowerSGDState)]
    return found[0] if found else None


def accumulate(model: nn.Module, is_last: bool) -> contextlib.AbstractContextManager[None]:
    """Run one micro-batch's forward and backward, syncing gradients only when ``is_last``.

    On DDP this is ``no_sync()`` for all but the last micro-batch; on FSDP2 it switches
    ``set_requires_gradient_sync``; anywhere else (world of one, ``"dp"``, ``"none"``) it does
    nothing, because there is nothing to sync. The backward pass must run inside the block.
    With N micro-batches, scale each loss by 1/N to get the big batch's update:

    >>> model = nn.Linear(3, 1)
    >>> for i, x in enumerate(torch.ones(4, 2, 3)):   # 4 micro-batches of 2
    ...     with accumulate(model, is_last=(i == 3)):
    ...         (model(x).sum() / 4).backward()
    """
    if is_last:
        return NO_OP  # shared: the common step (every one without accumulation) builds nothing
    if isinstance(model, DistributedDataParallel):
        return model.no_sync()
    if is_fsdp_module(model):
        return _fsdp_no_sync(model)
    return NO_OP


@contextlib.contextmanager
def _fsdp_no_sync(model: nn.Module) -> Iterator[None]:
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


def is_sync_step(index: int, accumulation_steps: int, total: int | None = None) -> bool:
    """Whether micro-batch ``index`` (0-based) ends an accumulation window.

    Every ``accumulation_steps``-th micro-batch does, and so does the last one of an epoch of
    ``total`` (a short final window is flushed, not carried over):

    >>> [is_sync_step(i, 3, total=7) for i in range(7)]
    [False, False, True, False, False, True, True]
    """
    steps = accumulation_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(
            f"accumulation_steps ({accumulation_steps!r}) must be an integer >= 1 (1 means "
            "sync every step)."
        )
    if index < 0 or (total is not None and index >= total):
        raise ValueError(f"index ({index}) must be in 0..{'' if total is None else total - 1}.")
    return (index + 1) % accumulation_steps == 0 or (total is not None and index == total - 1)
