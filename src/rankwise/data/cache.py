"""A local disk cache of a source's byte ranges, capped in bytes, evicting by the plan.

A DataLoader worker knows every fetch it will read this epoch (the plan is a pure function of
seed, epoch, world, rank and worker), so it knows when each cached range is next needed.
:class:`PlanCache` evicts the range needed furthest in the future (Belady's rule, optimal for
a known sequence) and does not keep a range whose next use is further than every cached one's::

    room for 2 ranges, plan of fetches: [a b] [c a] [b c]
    fetch 0: a, b kept. fetch 1: a from disk; c read, and kept: after fetch 1, a is never
    needed again, b and c at fetch 2 -> a is evicted for c. fetch 2: b and c from disk.

A range is a file ``START-STOP`` under the cache folder: one folder per source, rank and
worker, each worker writing and evicting only its own (its share of the cap), and reading its
peers' folders too, since the next epoch deals the rows to the workers afresh. A cache left by
an earlier epoch or run is found again on start, so a second epoch reads what it can from
disk. A range is written under a temporary name and renamed, and a file is taken only when its
length is the range's (anything else is missing, and read from the store again). The bytes
on disk never exceed the cap (of one rank's workers, per worker count).

>>> import tempfile
>>> cache = PlanCache(tempfile.mkdtemp(), cap=8)
>>> cache.plan([[(0, 4), (4, 8)], [(8, 12), (0, 4)]])
>>> reads = []
>>> def store(ranges):
...     reads.append(ranges); return [bytes(range(a, b)) for a, b in ranges]
>>> cache.read(0, [(0, 4), (4, 8)], store) == [bytes(range(0, 4)), bytes(range(4, 8))]
True
>>> _ = cache.read(1, [(8, 12), (0, 4)], store); reads, cache.held
([[(0, 4), (4, 8)], [(8, 12)]], 8)
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["PlanCache"]

Range = tuple[int, int]
NEVER = float("inf")


class PlanCache:
    """Byte ranges kept under ``folder`` (at most ``cap`` bytes), evicted by the plan given to
    :meth:`plan` (see the module). Thread-safe: a worker's prefetch threads share it."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        cap: int,
        peers: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        if cap < 0:
            raise ValueError(f"cache_bytes ({cap}) must be >= 0 (0: no cache).")
        self.folder, self.cap = Path(folder), int(cap)
        self.peers = [Path(p) for p in peers if Path(p) != self.folder]  # read, never written
        self.folder.mkdir(parents=True, exist_ok=True)
        self.sizes: dict[Range, int] = {}
        for entry in self.folder.iterdir():  # what an earlier epoch or run left
            start, _, stop = entry.name.partition("-")
            if start.isdigit() and stop.isdigit() and int(stop) > int(start):
                size = entry.stat().st_size
                if size == int(stop) - int(start):
                    self.sizes[(int(start), int(stop))] = size
                else:  # cut short (a run killed mid-write before writes were atomic)
                    entry.unlink(missing_ok=True)
            elif ".tmp" in stop and stop.partition(".tmp")[0].isdigit():
                entry.unlink(missing_ok=True)  # a write a killed run left unfinished
        self.held = sum(self.sizes.values())
        while self.held > self.cap:  # a smaller cap than the last run's
            self._drop(next(iter(self.sizes)))
        self._uses: dict[Range, list[int]] = {}
        self._lock = threading.Lock()
        self.hits = 0

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}  # a spawned copy

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def plan(self, fetches: Sequence[Sequence[Range]]) -> None:
        """The ranges each fetch of this epoch reads, in plan order."""
        uses: dict[Range, list[int]] = {}
        for index, ranges in enumerate(fetches):
            for r in ranges:
                uses.setdefault(r, []).append(index)
        with self._lock:
            self._uses = uses

    def _next_use(self, r: Range, after: int) -> float:
        uses = self._uses.get(r, [])
        i = bisect.bisect_right(uses, after)
        return uses[i] if i < len(uses) else NEVER

    def read(
        self, index: int, ranges: Sequence[Range], fetch: Callable[[list[Range]], list[bytes]]
    ) -> list[bytes]:
        """The bytes of ``ranges`` for fetch ``index`` of the plan: cached ones from disk, the
        rest by ``fetch(missing)`` (one call), then kept where Belady's rule says."""
        out: dict[Range, bytes] = {}
        with self._lock:
            cached = [r for r in ranges if r in self.sizes]
        for r in ranges:
            for folder in [self.folder] if r in cached else self.peers:
                try:
                    data = (folder / f"{r[0]}-{r[1]}").read_bytes()
                except FileNotFoundError:  # not there, or evicted meanwhile
                    continue
                if len(data) == r[1] - r[0]:
                    out[r] = data
                    break
                if folder == self.folder:  # not the range's bytes: missing, read again
                    with self._lock:
                        if r in self.sizes:
                            self._drop(r)
        missing = [r for r in ranges if r not in out]
        self.hits += len(out)
        if missing:
            for r, data in zip(missing, fetch(missing), strict=True):
                out[r] = data
                self._keep(index, r, data)
        return [out[r] for r in ranges]

    def _keep(self, index: int, r: Range, data: bytes) -> None:
        with self._lock:
            if r in self.sizes or len(data) > self.cap:
                return
            mine = self._next_use(r, index)
            while self.held + len(data) > self.cap:
                victim = max(self.sizes, key=lambda k: self._next_use(k, index))
                if self._next_use(victim, index) <= mine:
                    return  # every cached range is needed sooner than this one: skip it
                self._drop(victim)
            # Peers read this folder while it is written: a temporary name, then one rename,
            # so a reader finds the whole range or none of it.
            final = self.folder / f"{r[0]}-{r[1]}"
            temporary = final.with_name(f"{final.name}.tmp{os.getpid()}")
            temporary.write_bytes(data)
            os.replace(temporary, final)
            self.sizes[r] = len(data)
            self.held += len(data)

    def _drop(self, r: Range) -> None:
        self.held -= self.sizes.pop(r)
        (self.folder / f"{r[0]}-{r[1]}").unlink(missing_ok=True)
