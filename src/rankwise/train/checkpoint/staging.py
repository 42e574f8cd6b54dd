"""Copying a state dict into reusable CPU buffers, so it can be written while training goes on.

A background checkpoint must write the state as it was at a step boundary while the next
steps change the model and optimizer in place. :func:`snapshot` copies every tensor of a
(nested) state dict to the CPU, into the buffers of the previous snapshot where shapes and
dtypes match: refilling memory already touched is several times faster than fresh
allocations, which page-fault on first write. Refills on the CPU are split into pieces copied
by two threads at once (a copy releases the GIL; the training loop waits for the snapshot, so
a second core would otherwise idle). Tensors on a GPU are copied into pinned
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

import concurrent.futures
import os
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

__all__ = ["BackgroundSaves", "snapshot"]

T = TypeVar("T")
_PIECE = 1 << 22  # elements per piece of a parallel CPU refill (16 MB of fp32)
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def snapshot(state: Any, into: Any = None) -> Any:
    """A copy of ``state`` whose tensors live on the CPU and share no memory with ``state``'s.

    ``into`` is a previous snapshot of a state of the same structure; its tensors are reused
    (refilled in place) where shape and dtype match, so do not read it after this call. Values
    that are not tensors are shared, not copied: state dicts hold plain, immutable values there.
    """
    pending: list[Any] = []  # True per device copy; (buffer, source) per CPU refill
    copied = _copy(state, into, pending)
    _refill([job for job in pending if job is not True])
    if True in pending:  # one wait for all the device-to-host copies issued above
        torch.cuda.synchronize()
    return copied


def _refill(jobs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy each source into its buffer, in pieces shared by this thread and one more."""
    global _pool
    pieces = []
    for buffer, source in jobs:
        if not (buffer.is_contiguous() and source.is_contiguous()):
            buffer.copy_(source)
            continue
        flat_buffer, flat_source = buffer.view(-1), source.view(-1)
        for start in range(0, flat_buffer.numel(), _PIECE):
            pieces.append(
                (flat_buffer[start : start + _PIECE], flat_source[start : start + _PIECE])
            )
    if len(pieces) < 2 or (os.cpu_count() or 1) < 2:
        for buffer, source in pieces:
            buffer.copy_(source)
        return
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(1, "rankwise-snapshot")
    half = len(pieces) // 2
    other = _pool.submit(lambda: [b.copy_(s) for b, s in pieces[half:]])
    for buffer, source in pieces[:half]:
        buffer.copy_(source)
    other.result()


def _copy(state: Any, into: Any, pending: list[Any]) -> Any:
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


def _copy_tensor(tensor: torch.Tensor, into: Any, pending: list[Any]) -> torch.Tensor:
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
    if on_gpu:
        buffer.copy_(tensor, non_blocking=True)
        pending.append(True)
    elif tensor.device.type == "cpu":
        pending.append((buffer, tensor))  # refilled after the walk, in parallel pieces
    else:
        buffer.copy_(tensor)
    return buffer


class BackgroundSaves(Generic[T]):
    """One background thread writing snapshots, one at a time, in order; the last snapshot's
    buffers are refilled by the next (a folder's manager and a bucket's share it).

    :meth:`submit` waits for the previous write (re-raising its error), snapshots the state
    and hands ``write(snapshot)`` to the thread; :meth:`wait` returns its result.
    """

    def __init__(self) -> None:
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: concurrent.futures.Future[T] | None = None
        self._staged: Any = None  # the last snapshot, refilled by the next one

    def submit(
        self, write: Callable[[Any], T], state: Any, *, copy: bool = True
    ) -> concurrent.futures.Future[T]:
        """``write(snapshot(state))`` on the thread (``copy=False``: ``write(state)``, for a
        state that is staged already); blocks for the previous write and the copy only."""
        self.wait()
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, "rankwise-checkpoint")
        if copy:
            # The model and optimizer change in place from now on: write a copy. The previous
            # snapshot's write is finished (wait() above), so its memory can be refilled.
            state = self._staged = snapshot(state, into=self._staged)
        self._pending = self._executor.submit(write, state)
        return self._pending

    def pending(self) -> concurrent.futures.Future[T] | None:
        """The write not yet waited for (running or done), or None."""
        return self._pending

    def wait(self) -> T | None:
        """Block until the pending write (if any) is done; return its result. Re-raises its
        error."""
        # Cleared only once the write ended: a SIGTERM handler that runs while this waits
        # (Python runs it in this thread, inside result()) must find the write and drain it.
        pending = self._pending
        if pending is None:
            return None
        try:
            return pending.result()
        finally:
            if self._pending is pending:
                self._pending = None
