"""A stranger on an ``--on-failure continue`` job's store, for tests and the fault sweep.

Anyone who reaches the store's port is a store client: it can read, write and delete any key,
but holds no job secret. Two such clients, written against the real ``TCPStore``:

- :class:`StoreChaos`: a thread that, until stopped, writes garbage, plausible values, values
  it read elsewhere (replays to other keys) and deletions across the protocol's keys
  (:func:`protocol_keys`), and meanwhile asks to join as ``(slot, incarnation)`` and answers
  every challenge it sees with made-up proofs; :attr:`StoreChaos.admitted` says whether a
  member ever let it in (``admit/<slot>/<incarnation>`` written by anyone but itself).
- :class:`StoreRecorder` and :func:`replay`: record every value the protocol's keys held
  during a run, and later write the recorded ones back (the oldest ``dead`` and ``member``
  marks, the last join request, challenge and proof), delete the ``admit`` marks and ask to
  join as that incarnation again: the replayed-proof attack.

And one store for a reader's own tests: :class:`VanishingStore`, in which every key vanishes
the moment a ``check`` finds it (a reader must never ``check`` and then ``get``).

Example (a store at 127.0.0.1:29500 of a 3-slot job)::

    chaos = StoreChaos("127.0.0.1", 29500, protocol_keys(3), slot=2, incarnation=99)
    chaos.start(); ...; chaos.stop()
    assert not chaos.admitted
"""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from rankwise.distributed.contract import Keys, every_key
from rankwise.distributed.signing import NO_VALUE, read_raw

__all__ = [
    "StoreChaos",
    "StoreRecorder",
    "VanishingStore",
    "await_value",
    "connect",
    "protocol_keys",
    "replay",
]


def connect(host: str, port: int, timeout_s: float = 60.0) -> dist.TCPStore:
    """A plain client of the store at ``host:port`` (retried until it listens, up to
    ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return dist.TCPStore(
                host, port, is_master=False, wait_for_workers=False,
                timeout=timedelta(seconds=10),
            )  # fmt: skip
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def await_value(store: dist.Store, key: str, timeout_s: float = 60.0) -> bytes:
    """The value of ``key`` once it is set, read with :func:`read_raw` every 0.05 s.

    Not ``store.wait([key])``: on torch's libuv server a ``compare_set`` of a missing key
    (every member's :func:`read_raw`) wakes whoever waits for it, and the ``get`` after such a
    wake-up answers ``b""`` (a test's stranger once answered a challenge it never read).
    Raises ``TimeoutError`` after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while (value := read_raw(store, key)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{key!r} was not set within {timeout_s:g} s")
        time.sleep(0.05)
    return value


def protocol_keys(
    world: int, generations: int = 6, incarnations: int = 3, nnodes: int = 1
) -> list[str]:
    """Every key the membership protocol and the launchers use (the contract's
    :func:`~rankwise.distributed.contract.every_key`), for a job of ``world`` slots."""
    return every_key(world, generations, incarnations, nnodes)


_GARBAGE = [
    *(sentinel.encode() for sentinel in NO_VALUE),  # read_raw's own: a key holding one is read
    b"", b"x", b"-1", b"99", b"0,1,2,99", b"0;", b"1|" + b"0" * 64, b"\xff\xfe", b"9" * 40,
    b"0:" + b"a" * 32, b"0:" + b"a" * 32 + b":" + b"b" * 64, b"1,1,1;1", b"a,b",
]  # fmt: skip


class StoreChaos:
    """A store client that writes garbage, replays and deletes across ``keys`` every
    ``interval_s`` (see the module doc) while asking to join as ``slot`` / ``incarnation``."""

    def __init__(
        self, host: str, port: int, keys: list[str], slot: int = 0, incarnation: int = 99,
        seed: int = 0, interval_s: float = 0.01,
    ) -> None:  # fmt: skip
        self.host, self.port, self.keys = host, port, list(keys)
        self.slot, self.incarnation, self.interval_s = slot, incarnation, interval_s
        self.random = random.Random(seed)
        self.admit_key = Keys.admit(slot, incarnation)
        self.keys = [k for k in self.keys if k != self.admit_key]  # its own admission: read
        self.admitted = False  # a member let it in (it never writes that key itself)
        self.ops = 0
        self.seen: list[bytes] = []  # values it read, to replay elsewhere
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-chaos", daemon=True)

    def start(self) -> StoreChaos:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        try:
            store = connect(self.host, self.port)
        except Exception:
            return  # the job ended before the chaos began
        while not self._stop.wait(self.interval_s):
            try:
                self._once(store)
            except Exception:  # the store is gone (the job ended), or a deleted key raced
                if self._stop.is_set():
                    return
                try:
                    store = connect(self.host, self.port, timeout_s=1.0)
                except Exception:
                    return

    def _once(self, store: Any) -> None:  # Any: torch takes bytes values too
        if store.check([self.admit_key]):
            self.admitted = True
        r = self.random
        self.ops += 1
        if self.ops % 5 == 0:  # ask to join, and answer whatever challenge is there
            store.set(Keys.join(self.slot), str(self.incarnation))
            old = read_raw(store, Keys.WAITING) or b""
            store.compare_set(Keys.WAITING, old, f"{self.slot}")
            challenge = read_raw(store, Keys.challenge(self.slot, self.incarnation))
            if challenge is not None:
                text = challenge.split(b"|")[0]
                store.set(Keys.proof(self.slot, self.incarnation), text + b":" + b"c" * 64)
            return
        key = r.choice(self.keys)
        op = r.random()
        if op < 0.3:
            store.delete_key(key)
        elif op < 0.5 and self.seen:
            store.set(key, r.choice(self.seen))  # a value read elsewhere: a replay
        elif op < 0.8:
            store.set(key, r.choice(_GARBAGE))
        else:
            store.set(key, bytes(r.randrange(256) for _ in range(r.randrange(1, 80))))
        if (value := read_raw(store, r.choice(self.keys))) is not None:
            self.seen = [*self.seen[-50:], value]


class StoreRecorder:
    """Every distinct value ``keys`` held, in the order seen (polled every ``interval_s``
    by a thread of its own until :meth:`stop`)."""

    def __init__(self, host: str, port: int, keys: list[str], interval_s: float = 0.002):
        self.host, self.port, self.keys, self.interval_s = host, port, list(keys), interval_s
        self.values: dict[str, list[bytes]] = {}
        self._client: dist.TCPStore | None = None
        self._lock = threading.Lock()  # its thread and a caller's snapshots share the client
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-recorder", daemon=True)

    def start(self) -> StoreRecorder:
        self._thread.start()
        return self

    def stop(self) -> dict[str, list[bytes]]:
        self._stop.set()
        self._thread.join(30)
        return self.values

    def snapshot(self) -> None:
        """Record the values ``keys`` hold now (through a client of its own; each read one
        request that never waits for a key deleted meanwhile: ``read_raw``)."""
        with self._lock:
            if self._client is None:
                self._client = connect(self.host, self.port)
            store = self._client
            for key in self.keys:
                value = read_raw(store, key)
                if value is not None and value not in self.values.setdefault(key, []):
                    self.values[key].append(value)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.snapshot()
            except Exception:  # the store is gone
                return


def replay(
    store: Any, recorded: dict[str, list[bytes]], slot: int, incarnation: int,
    roll_back: bool = True,
) -> None:  # fmt: skip
    """The replayed-proof attack on ``slot``'s ``incarnation`` (one that came in before and
    is dead now): the oldest recorded ``dead/<slot>`` and ``member/<slot>`` marks back (as if
    it never entered nor died; ``roll_back=False`` leaves them), a join request naming
    ``incarnation``, its recorded challenge and proof back, its ``admit`` and ``refused``
    marks deleted, and the slot on the waiting list again."""
    for key in (Keys.admit(slot, incarnation), Keys.refused(slot, incarnation)):
        store.delete_key(key)
    for key in (Keys.dead(slot), Keys.member(slot)) if roll_back else ():
        if recorded.get(key):
            store.set(key, recorded[key][0])
        else:
            store.delete_key(key)
    store.set(Keys.join(slot), str(incarnation))
    for key in (Keys.challenge(slot, incarnation), Keys.proof(slot, incarnation)):
        if recorded.get(key):
            store.set(key, recorded[key][-1])
    asked = [v for v in recorded.get(Keys.WAITING, []) if str(slot).encode() in v.split(b",")]
    store.set(Keys.WAITING, asked[-1] if asked else str(slot).encode())


class VanishingStore(dist.Store):
    """A real store (``HashStore``) where every key vanishes the moment a ``check`` finds it:
    the worst interleaving of a reader with whoever deletes keys (the protocol's own used
    proofs and challenges, or anyone on the port). Its ``get`` of a missing key fails at
    once, where torch's would wait for the store's whole timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = dist.HashStore()
        self.waits: list[str] = []

    def check(self, keys: list[str]) -> bool:
        found = self.inner.check(keys)
        for key in keys:
            if self.inner.check([key]):
                self.inner.delete_key(key)
        return found

    def get(self, key: str) -> bytes:
        if not self.inner.check([key]):
            self.waits.append(key)
            raise RuntimeError(f"a get of the missing key {key!r} waits for the timeout")
        return self.inner.get(key)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(key) for key in keys]

    def set(self, key: str, value: str) -> None:
        self.inner.set(key, value)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return self.inner.compare_set(key, expected, desired)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def add(self, key: str, amount: int) -> int:
        return self.inner.add(key, amount)
