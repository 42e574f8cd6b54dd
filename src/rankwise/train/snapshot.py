"""Copying a state dict into reusable CPU buffers, so it can be written while training goes on.

A background checkpoint must write the state as it was at a step boundary while the next
steps change the model and optimizer in place. :func:`snapshot` copies every tensor of a
(nested) state dict to the CPU, into the buffers of the previous snapshot where shapes and
dtypes match: refilling memory already touched is several times faster than fresh
allocations, which page-fault on first write. Tensors on a GPU are copied into pinned
buffers with ``non_blocking=True`` and one synchronisation at the end, so the copies overlap
each other instead of each waiting for the last.

>>> state = {"w": torch.ones(2), "step": 3}
>>> first = snapshot(state)
>>> state["w"] += 1                     # training goes on in place
>>> first["w"].tolist(), first["step"]
([1.0, 1.0], 3)
>>> again = snapshot(state, into=first)  # the same buffers, refilled
>>> again["w"] is first["w"], again["w"].tolist()
(True, [2.0, 2.0])
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["snapshot"]


def snapshot(state: Any, into: Any = None) -> Any:
    """A copy of ``state`` whose tensors live on the CPU and share no memory with ``state``'s.

    ``into`` is a previous snapshot of a state of the same structure; its tensors are reused
    (refilled in place) where shape and dtype match, so do not read it after this call. Values
    that are not tensors are shared, not copied: state dicts hold plain, immutable values there.
    """
    pending: list[bool] = []
    copied = _copy(state, into, pending)
    if pending:  # one wait for all the device-to-host copies issued above
        torch.cuda.synchronize()
    return copied


def _copy(state: Any, into: Any, pending: list[bool]) -> Any:
    if isinstance(state, torch.Tensor):
        return _copy_tensor(state.detach(), into, pending)
    if isinstance(state, dict):
        old = into if isinstance(into, dict) else {}
        return type(state)((k, _copy(v, old.get(k), pending)) for k, v in state.items())
    if type(state) in (list, tuple):
        prev = into if type(into) is type(state) and len(into) == len(state) else None
        return type(state)(
            _copy(v, prev[i] if prev else None, pending) for i, v in enumerate(state)
        )
    return state


def _copy_tensor(tensor: torch.Tensor, into: Any, pending: list[bool]) -> torch.Tensor:
    on_gpu = tensor.device.type == "cuda"
    reusable = (
        isinstance(into, torch.Tensor)
        and into.device.type == "cpu"
        and into.shape == tensor.shape
        and into.dtype == tensor.dtype
        and (into.is_pinned() or not on_gpu)
    )
    if reusable:
        buffer = into
    elif on_gpu:
        buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    else:
        return tensor.to("cpu", copy=True)
    buffer.copy_(tensor, non_blocking=on_gpu)
    if on_gpu:
        pending.append(True)
    return buffer
