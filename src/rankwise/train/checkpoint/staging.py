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

Module state: the two-thread refill pool, made on first use and shared by every snapshot of
the process (one training loop takes one snapshot at a time; a pool per call would start
threads at every save).
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
import time
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
    """One background thread writing snapshots, one at a time, in order; a snapshot's buffers
    are refilled by a later one once its write ended (a folder's manager and a bucket's share
    it).

    :meth:`submit` waits for the writes handed over before (re-raising an error), snapshots the
    state and hands ``write(snapshot)`` to the thread; :meth:`wait` returns its result. With
    ``behind=True`` it does not wait: the write queues behind the one running, and replaces a
    queued one that has not started (the newest state wins), so a store that does not answer
    holds the loop for the snapshot only; at most two snapshots then exist, the one being
    written and the newest.
    """

    def __init__(self) -> None:
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # handed to the thread and not yet waited for, oldest first (the first runs or ended)
        self._writes: collections.deque[concurrent.futures.Future[T]] = collections.deque()
        self._free: list[Any] = []  # snapshots whose write ended: refilled by the next
        self._staged_of: dict[concurrent.futures.Future[T], Any] = {}  # each write's snapshot
        self._lock = threading.Lock()
        self.started_at = 0.0  # time.monotonic() when the thread began its latest write

    def submit(
        self, write: Callable[[Any], T], state: Any, *, copy: bool = True, behind: bool = False
    ) -> concurrent.futures.Future[T]:
        """``write(snapshot(state))`` on the thread (``copy=False``: ``write(state)``, for a
        state that is staged already); blocks for the previous writes and the copy only, or,
        ``behind``, for the copy only (a queued write not started yet is cancelled: its
        future says so)."""
        if behind:
            for queued in list(self._writes)[1:]:  # the first runs (or ended): never cancelled
                if queued.cancel():  # it never runs: its snapshot is free now
                    self._writes.remove(queued)
                    staged = self._staged_of.pop(queued, None)
                    if staged is not None:
                        self._release(staged)
        else:
            self.wait()
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, "rankwise-checkpoint")
        staged = None
        if copy:
            # The model and optimizer change in place from now on: write a copy, into the
            # buffers of a snapshot whose write ended (never of one being written).
            with self._lock:
                into = self._free.pop() if self._free else None
            state = staged = snapshot(state, into=into)
        future = self._executor.submit(self._run, write, state, staged)
        if staged is not None:
            self._staged_of[future] = staged
        self._writes.append(future)
        return future

    def _run(self, write: Callable[[Any], T], state: Any, staged: Any) -> T:
        self.started_at = time.monotonic()
        try:
            return write(state)
        finally:  # before the result is seen: the next snapshot refills these buffers
            if staged is not None:
                self._release(staged)

    def _release(self, staged: Any) -> None:
        with self._lock:
            if len(self._free) < 2:  # the one being refilled and one more, at most
                self._free.append(staged)

    def pending(self) -> concurrent.futures.Future[T] | None:
        """The oldest write not yet waited for (running or done), or None."""
        return self._writes[0] if self._writes else None

    def wait(self, timeout: float | None = None, *, first: bool = False) -> T | None:
        """Block until the writes handed over (``first``: the oldest only) are done; return
        the last one's result (None for a write replaced before it started). Re-raises an
        error, the oldest first (the later writes stay pending). ``timeout`` (seconds, in
        all): raises ``TimeoutError`` once it passed, the write still pending."""
        deadline = None if timeout is None else time.monotonic() + timeout
        result: T | None = None
        while self._writes:
            # Removed only once the write ended: a SIGTERM handler that runs while this waits
            # (Python runs it in this thread, inside result()) must find the write and drain it.
            pending = self._writes[0]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                result = pending.result(left)
            except concurrent.futures.CancelledError:
                result = None
            except concurrent.futures.TimeoutError:
                if pending.done():  # the write's own TimeoutError (3.11: the same class)
                    raise
                raise TimeoutError(f"the write did not end within {timeout:g} s") from None
            finally:
                if pending.done() and self._writes and self._writes[0] is pending:
                    self._writes.popleft()
                    self._staged_of.pop(pending, None)
            if first:
                break
        return result
