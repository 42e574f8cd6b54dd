"""Name the rank that did not arrive when a collective times out.

gloo's timeout says only "Timed out waiting 10000ms for recv operation": not which operation,
and not which peer is missing. :class:`Progress` adds both on torch's own pieces: before each
collective a rank leaves a mark (a counter and the operation's name) under a key of its own in
the process group's store (torch's ``TCPStore``; a ``set`` does not wait for a reply, a few
microseconds), and when a collective times out the rank reads its peers' marks: those whose
counter is behind its own never reached the operation it is stuck in::

    progress = Progress("my-loop")
    with progress.operation("all_reduce of the gradients at step 5"):
        loss.backward()          # DDP's all-reduce; a timeout becomes:
    # DistributedTimeoutError: all_reduce of the gradients at step 5 timed out on rank 0
    # after 10000 ms: rank 1 did not arrive (its last operation: all_reduce of the gradients
    # at step 4) ...

Every rank must make the same sequence of marks (the same code path), as with collectives, and
name its ``Progress`` alike: the name is the key, so objects made on some ranks only shift
nothing. Marks are left only in a ``TCPStore`` (torch's default, and torchrun's): a
``FileStore`` (``init_method="file://..."``) appends every ``set`` to its file and never
compacts it, so there ``Progress`` is an identity and a timeout is reported without the names.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch.distributed as dist

from rankwise.distributed.errors import DistributedTimeoutError, first_line
from rankwise.distributed.failures import classify
from rankwise.distributed.group import collective_timeout_ms, get_rank, get_world_size, has_group
from rankwise.distributed.signing import read_raw

# How long a timed-out rank waits for its peers' marks: the store's host may be frozen
# (stopped, in D-state, cut off), and a report without names beats a rank that never raises.
READ_DEADLINE_S = 2.0


class Progress:
    """Where this rank is, left in the group's store for peers whose collective times out.

    ``name`` keys the marks in the store: every rank names its ``Progress`` alike (e.g.
    ``"trainer/fit-1"``), never from a process-wide counter that a rank-local object would shift.
    Identity without a process group or on a store other than a ``TCPStore``. ``mark(what)``
    costs one store ``set`` (no reply is awaited); :meth:`operation` marks and turns a timeout
    inside it into :class:`DistributedTimeoutError` naming the operation and the ranks behind.

    >>> progress = Progress("my-loop")  # no process group: marks cost nothing
    >>> with progress.operation("all_reduce of the loss"):
    ...     pass
    >>> progress.current
    'all_reduce of the loss'
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"Progress needs a name that is the same on every rank, got {name!r}; e.g. "
                'Progress("my-loop") (the name keys its marks in the store).'
            )
        self._prefix = f"rankwise/progress/{name}/"
        self._store = _group_store()
        self._unmarked = self._store is None and has_group() and get_world_size() > 1
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
            error = self.explain(exc)
            if error is None:
                raise
            raise error from exc

    def explain(self, exc: BaseException) -> Exception | None:
        """:class:`DistributedTimeoutError` naming the ranks behind, for a timeout ``exc`` of
        the current operation, or for a peer that closed its connection while a rank had not
        arrived (with 3+ ranks the first survivor to time out closes its connections, so the
        others see that instead of their own timeout); None for any other error."""
        failure = classify(exc)
        if failure == "timeout":
            return self.timeout_error(exc)
        if failure != "peer-lost":
            return None
        peers = self._peers()
        behind = self._behind(peers or {})
        if not behind:  # unreadable, or every peer had arrived: a crash inside it, say nothing
            return None
        where = self.current or "a collective"
        head = (
            f"{where} failed on rank {self._rank}: a peer closed its connection (it timed out "
            f"waiting first, or exited), and {_describe_behind(behind, peers or {})}"
        )
        return DistributedTimeoutError(_with_advice(head, exc))

    def timeout_error(self, exc: BaseException) -> Exception:
        """The error for a timeout ``exc`` of the current operation, naming the missing ranks."""
        if isinstance(exc, DistributedTimeoutError):
            return exc
        where = self.current or "a collective"
        timeout_ms = collective_timeout_ms()
        after = f" after {timeout_ms} ms" if timeout_ms else ""
        head = f"{where} timed out on rank {self._rank}{after}"
        peers = self._peers()
        if self._unmarked:
            who = "no rank leaves progress marks on this group's store (only a TCPStore takes them)"
        elif peers is None:
            who = (
                f"the peers' progress could not be read from the store within {READ_DEADLINE_S:g} "
                "s (its host, rank 0, may have exited or be frozen)"
            )
        else:
            who = _describe_behind(self._behind(peers), peers)
        return DistributedTimeoutError(_with_advice(f"{head}: {who}", exc))

    def _behind(
        self, peers: dict[int, tuple[int, str] | None]
    ) -> dict[int, tuple[int, str] | None]:
        """The peers that never reached this rank's current operation (fewer marks)."""
        return {r: p for r, p in peers.items() if p is None or p[0] < self._count}

    def _peers(self) -> dict[int, tuple[int, str] | None] | None:
        """Every other rank's last mark (None: it never marked); None if unreadable in time.

        Read in a daemon thread: a store call to a frozen host never returns, and a rank that
        waited for it would never raise (so torchrun would never restart the job).
        """
        store = self._store
        if store is None:
            return None
        keys = {r: f"{self._prefix}{r}" for r in range(self._world) if r != self._rank}
        result: list[dict[int, tuple[int, str] | None]] = []

        def read() -> None:
            with contextlib.suppress(Exception):
                result.append(_read_marks(store, keys))

        reader = threading.Thread(target=read, name="rankwise-progress-read", daemon=True)
        reader.start()
        reader.join(READ_DEADLINE_S)
        return result[0] if result else None


def _read_marks(store: dist.Store, keys: dict[int, str]) -> dict[int, tuple[int, str] | None]:
    """The marks, each read with :func:`~.signing.read_raw` (a missing one is None at once:
    a ``get`` would wait for it, a ``check`` then ``get`` too if it went in between)."""
    peers: dict[int, tuple[int, str] | None] = dict.fromkeys(keys)
    for rank, key in keys.items():
        value = read_raw(store, key)
        if value is not None:
            count, _, what = value.decode().partition("\t")
            peers[rank] = (int(count), what)
    return peers


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


def _with_advice(head: str, exc: BaseException) -> str:
    return (
        f"{head}. A rank that stops participating (stuck, deadlocked, stopped in a "
        "debugger, starved of CPU) stalls every collective: look at that rank's log or "
        "stack (py-spy dump --pid PID); if it is only slow (e.g. a long checkpoint save), "
        "raise the collective timeout (DISTRIBUTED_COLLECTIVE_TIMEOUT_MS or "
        f"DistributedConfig.collective_timeout_ms). torch said: {first_line(exc)}"
    )


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


def _group_store() -> dist.Store | None:
    """The default group's store if it is a ``TCPStore`` underneath, else None.

    torch keeps it (there is no public getter). Any other store (a ``FileStore`` appends every
    ``set`` to its file, never compacted) would grow with every mark, so it is left alone.
    """
    if not has_group() or get_world_size() == 1:
        return None
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        store = _get_default_store()
    except Exception:  # a torch without it: progress is simply not shared
        return None
    return store if isinstance(_underlying(store), dist.TCPStore) else None


def _underlying(store: dist.Store) -> dist.Store:
    """The store under any ``PrefixStore`` s (torch and torchrun nest them)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store
