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
on disk never exceed the cap (of one rank's workers).

:func:`worker_cache` lays the folders out under ``cache_dir``, one per version of a source::

    cache_dir/<url digest>-<version digest>/.rankwise-cache           the marker
    cache_dir/<url digest>-<version digest>/rank0-of1-worker0-of2/    START-STOP files

and, when a worker opens its folder, removes the folders of the same URL made for other
versions of its files (only folders holding the marker: rankwise's own), the folders of other
rank and worker counts in its version's folder, and trims its peers' folders to the cap; so
``cache_dir`` holds at most one cap per rank for a URL, whatever was cached before. A process
still reading a removed folder loses nothing but speed: a missing or short file is read from
the store again, and a write into a folder that is gone is dropped.

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
import contextlib
import json
import os
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from rankwise.storage.local import TMP_MARK, remove_tree

__all__ = ["MARKER", "Joined", "PlanCache", "worker_cache"]

Range = tuple[int, int]
NEVER = float("inf")
# The file marking a folder under cache_dir as one rankwise made (and may remove).
MARKER = ".rankwise-cache"
_LAYOUT = re.compile(r"rank(\d+)-of(\d+)-worker(\d+)-of(\d+)")


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
        for entry, r, size in _entries(self.folder):  # what an earlier epoch or run left
            if r is not None and size == r[1] - r[0]:
                self.sizes[r] = size
            else:  # cut short, or a write a killed run left unfinished
                entry.unlink(missing_ok=True)
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
    ) -> list[memoryview]:
        """The bytes of ``ranges`` for fetch ``index`` of the plan: cached ones from disk, the
        rest by ``fetch(missing)`` (one call), then kept where Belady's rule says. Each is a
        view into one buffer (:meth:`read_joined`'s)."""
        view, at, out = self.read_joined(index, ranges, fetch).data, 0, []
        for a, b in ranges:
            out.append(view[at : at + b - a])
            at += b - a
        return out

    def read_joined(
        self, index: int, ranges: Sequence[Range], fetch: Callable[[list[Range]], list[bytes]]
    ) -> Joined:
        """The bytes of ``ranges`` joined in their order into one new buffer: a cached range is
        read from its file straight into its place (no copy in between), the others fetched,
        copied in and kept, as :meth:`read` does."""
        out = joined_buffer(sum(b - a for a, b in ranges))
        view = out.data  # a memoryview of its bytes
        at, missing = 0, []
        for r in ranges:
            n = r[1] - r[0]
            if not self._load(r, view[at : at + n]):
                missing.append((r, at))
            at += n
        self.hits += len(ranges) - len(missing)
        if missing:
            for (r, at), data in zip(missing, fetch([r for r, _ in missing]), strict=True):
                view[at : at + r[1] - r[0]] = data  # another length: ValueError
                self._keep(index, r, data)
        return out

    def _load(self, r: Range, into: memoryview) -> bool:
        """Whether range ``r`` was read into ``into`` from this folder (where this cache holds
        it) or else a peer's; a file of another length is missing (and dropped, if it is
        this folder's)."""
        with self._lock:
            mine = r in self.sizes
        for folder in [self.folder] if mine else self.peers:
            if _read_file(folder / f"{r[0]}-{r[1]}", into):
                return True
            if folder == self.folder:  # gone or not the range's bytes: read again
                with self._lock:
                    if r in self.sizes:
                        self._drop(r)
        return False

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
            try:
                temporary.write_bytes(data)
                os.replace(temporary, final)
            except OSError:  # the folder was removed (a newer version's run) or the disk is full
                with contextlib.suppress(OSError):
                    temporary.unlink()
                return
            self.sizes[r] = len(data)
            self.held += len(data)

    def _drop(self, r: Range) -> None:
        self.held -= self.sizes.pop(r)
        with contextlib.suppress(OSError):
            (self.folder / f"{r[0]}-{r[1]}").unlink()


class Joined(np.ndarray):
    """The pieces of a fetch already joined into one new writable buffer of bytes (by
    :meth:`PlanCache.read_joined`), which a parse may take as it is instead of joining.
    Made by :func:`joined_buffer`: uninitialised memory, filled by reads (a bytearray's
    zero-filling cost a third of a warm-cache fetch)."""


def joined_buffer(size: int) -> Joined:
    """A new :class:`Joined` of ``size`` bytes (not zeroed)."""
    return np.empty(size, dtype=np.uint8).view(Joined)


def _read_file(path: Path, into: memoryview) -> bool:
    """Whether the file ``path`` holds exactly ``len(into)`` bytes, now read into ``into``
    (a file missing, of another length, or cut while read: False)."""
    try:
        with open(path, "rb", buffering=0) as f:
            if os.fstat(f.fileno()).st_size != len(into):
                return False
            got = 0
            while got < len(into):
                n = f.readinto(into[got:])
                if not n:
                    return False
                got += n
            return True
    except OSError:  # not there: evicted, or removed (another version's folder)
        return False


def _entries(folder: Path) -> list[tuple[Path, Range | None, int]]:
    """The files in ``folder``: each with its range (None: not a range's name) and size;
    none for a folder that is gone, nor for a file removed while listed."""
    out = []
    try:
        listed = list(folder.iterdir())
    except OSError:
        return []
    for entry in listed:
        start, _, stop = entry.name.partition("-")
        r = (int(start), int(stop)) if start.isdigit() and stop.isdigit() else None
        if r is None and not (".tmp" in stop and stop.partition(".tmp")[0].isdigit()):
            continue  # not a file a cache writes
        try:
            out.append((entry, r if r is not None and r[1] > r[0] else None, entry.stat().st_size))
        except OSError:
            continue
    return out


def worker_cache(
    cache_dir: str | os.PathLike[str],
    name: tuple[str, str],
    about: dict[str, object],
    cap: int,
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
) -> PlanCache:
    """The :class:`PlanCache` of ``worker`` (of ``num_workers``) on ``rank`` (of
    ``world_size``) for the source version ``name`` (its URL's digest, its version's), holding
    ``cap // num_workers`` bytes; first removes what other versions and layouts of the same
    URL left under ``cache_dir`` (see the module). ``about`` goes into the marker (JSON)."""
    url_digest, version_digest = name
    root = Path(cache_dir)
    mine = root / f"{url_digest}-{version_digest}"
    mine.mkdir(parents=True, exist_ok=True)
    if not (mine / MARKER).exists():
        temporary = mine / f"{MARKER}{TMP_MARK}{os.getpid()}-{worker}"
        temporary.write_text(json.dumps(about, sort_keys=True) + "\n")
        os.replace(temporary, mine / MARKER)
    for entry in _listed(root):
        # another version's folder, or one a killed removal left renamed (".<name>.tmp-...")
        base = entry.name.lstrip(".").split(TMP_MARK)[0]
        other = entry.name != mine.name and base.startswith(f"{url_digest}-")
        if other and re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", base) and (entry / MARKER).exists():
            remove_tree(entry)
    layout = (world_size, num_workers)
    folders = [
        mine / f"rank{rank}-of{world_size}-worker{w}-of{num_workers}" for w in range(num_workers)
    ]
    share = cap // num_workers
    for entry in _listed(mine):
        match = _LAYOUT.fullmatch(entry.name)
        if match is None:
            continue
        if (int(match[2]), int(match[4])) != layout:
            remove_tree(entry)  # a run of other rank or worker counts
        elif entry != folders[worker]:
            _trim(entry, share)  # a peer's, maybe of a larger cap: its owner trims it too
    return PlanCache(folders[worker], share, peers=folders)


def _listed(folder: Path) -> list[Path]:
    try:
        return [entry for entry in folder.iterdir() if entry.is_dir()]
    except OSError:
        return []


def _trim(folder: Path, cap: int) -> None:
    """Remove files from ``folder`` until its files hold at most ``cap`` bytes."""
    entries = _entries(folder)
    held = sum(size for _, _, size in entries)
    for entry, _, size in entries:
        if held <= cap:
            return
        with contextlib.suppress(OSError):
            entry.unlink()
        held -= size
