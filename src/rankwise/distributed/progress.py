"""Name the rank that did not arrive when a collective times out.

gloo's timeout says only "Timed out waiting 10000ms for recv operation": not which operation,
and not which peer is missing. :class:`Progress` adds both on torch's own pieces: before each
collective a rank leaves a mark (a counter and the operation's name) under a key of its own in
the process group's store (torch's ``TCPStore``; a ``set`` does not wait for a reply, a few
microseconds), and when a collective times out the rank reads its peers' marks: those whose
counter is behind its own never reached the operation it is stuck in::

    progress = Progress()
    with progress.operation("all_reduce of the gradients at step 5"):
        loss.backward()          # DDP's all-reduce; a timeout becomes:
    # DistributedTimeoutError: all_reduce of the gradients at step 5 timed out on rank 0
    # after 10000 ms: rank 1 did not arrive (its last operation: all_reduce of the gradients
    # at step 4) ...

Every rank must make the same sequence of marks (the same code path), as with collectives.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import torch.distributed as dist

from rankwise.distributed.errors import DistributedTimeoutError
from rankwise.distributed.group import collective_timeout_ms, get_rank, get_world_size, has_group

# What gloo (and torch's store and work objects) say when an operation ran out of time.
_TIMEOUT_WORDS = ("timed out", "timeout")
_BACKENDS = ("gloo", "nccl", "c10d")
_instances = itertools.count()  # each Progress gets keys of its own (equal order on all ranks)


class Progress:
    """Where this rank is, left in the group's store for peers whose collective times out.

    Identity without a process group. ``mark(what)`` costs one store ``set`` (no reply is
    awaited); :meth:`operation` marks and turns a timeout inside it into
    :class:`DistributedTimeoutError` naming the operation and the ranks that are behind.

    >>> progress = Progress()           # no process group: marks cost nothing
    >>> with progress.operation("all_reduce of the loss"):
    ...     pass
    >>> progress.current
    'all_reduce of the loss'
    """

    def __init__(self) -> None:
        self._prefix = f"rankwise/progress/{next(_instances)}/"
        self._store = _group_store()
        self._rank = get_rank()
        self._world = get_world_size()
        self._count = 0
        self.current = ""

    def mark(self, what: str) -> None:
        """Record that this rank is about to enter ``what`` (a phrase naming the operation)."""
        self._count += 1
        self.current = what
        if self._store is None:
            return
        try:
            self._store.set(f"{self._prefix}{self._rank}", f"{self._count}\t{what}")
        except Exception:  # the store's host is gone: the next collective fails on its own
            self._store = None

    @contextlib.contextmanager
    def operation(self, what: str) -> Iterator[None]:
        """Mark ``what``, run the block; a timeout inside it names the ranks that are behind."""
        self.mark(what)
        try:
            yield
        except RuntimeError as exc:
            if not is_timeout(exc):
                raise
            raise self.timeout_error(exc) from exc

    def timeout_error(self, exc: BaseException) -> Exception:
        """The error for a timeout ``exc`` of the current operation, naming the missing ranks."""
        if isinstance(exc, DistributedTimeoutError):
            return exc
        where = self.current or "a collective"
        timeout_ms = collective_timeout_ms()
        after = f" after {timeout_ms} ms" if timeout_ms else ""
        head = f"{where} timed out on rank {self._rank}{after}"
        peers = self._peers()
        if peers is None:
            who = (
                "the peers' progress could not be read from the store (its host, rank 0, may "
                "have exited)"
            )
        else:
            behind = {r: p for r, p in peers.items() if p is None or p[0] < self._count}
            who = _describe_behind(behind, peers)
        return DistributedTimeoutError(
            f"{head}: {who}. A rank that stops participating (stuck, deadlocked, stopped in a "
            "debugger, starved of CPU) stalls every collective: look at that rank's log or "
            "stack (py-spy dump --pid PID); if it is only slow (e.g. a long checkpoint save), "
            "raise the collective timeout (DISTRIBUTED_COLLECTIVE_TIMEOUT_MS or "
            f"DistributedConfig.collective_timeout_ms). torch said: {_first_line(exc)}"
        )

    def _peers(self) -> dict[int, tuple[int, str] | None] | None:
        """Every other rank's last mark (None: it never marked); None if unreadable."""
        if self._store is None:
            return None
        peers: dict[int, tuple[int, str] | None] = {}
        try:
            for rank in range(self._world):
                if rank == self._rank:
                    continue
                key = f"{self._prefix}{rank}"
                # check() does not block: a rank that never marked has no key yet.
                if not self._store.check([key]):
                    peers[rank] = None
                    continue
                count, _, what = self._store.get(key).decode().partition("\t")
                peers[rank] = (int(count), what)
        except Exception:
            return None
        return peers


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's report of a collective or store operation out of time.

    gloo raises a plain ``RuntimeError`` naming its source file; torch's own errors are
    ``DistError`` s. Other timeouts (a DataLoader worker's) are left alone.

    >>> is_timeout(RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting"))
    True
    >>> is_timeout(RuntimeError("DataLoader timed out after 5 seconds"))
    False
    """
    text = str(exc).lower()
    if not any(word in text for word in _TIMEOUT_WORDS):
        return False
    return isinstance(exc, dist.DistError) or (
        isinstance(exc, RuntimeError) and any(b in text for b in _BACKENDS)
    )


def _describe_behind(
    behind: dict[int, tuple[int, str] | None], peers: dict[int, tuple[int, str] | None]
) -> str:
    if not behind:
        return (
            f"every other rank ({_ranks(sorted(peers))}) had reached it, so one of them is "
            "stuck inside it (or the network between the ranks failed)"
        )
    ranks = sorted(behind)
    lasts = []
    for rank in ranks:
        mark = behind[rank]
        last = "none yet" if mark is None else mark[1]
        lasts.append(f"rank {rank}: {last}")
    return f"{_ranks(ranks)} did not arrive (last operation entered: {'; '.join(lasts)})"


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _group_store() -> dist.Store | None:
    """The default group's store (torch keeps it; there is no public getter), else None."""
    if not has_group() or get_world_size() == 1:
        return None
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:  # a torch without it: progress is simply not shared
        return None
