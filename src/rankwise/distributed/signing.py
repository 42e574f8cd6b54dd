"""Every value of the ``--on-failure continue`` store, signed with the job's secret and checked
where it is read.

The job's ``TCPStore`` is not authenticated: anyone who reaches its port can read, write and
delete any key. So the membership protocol (:mod:`rankwise.distributed.membership`) and the
launchers (:mod:`rankwise.launch.supervisor`) write each value they act on *signed*::

    <value>|<hex HMAC-SHA256(job secret, "rankwise-store-v1" | job id | key | value)>

The signature covers the key's name (a value cannot be moved to another key) and the job's id
(nor into another job that shares the secret), so a value a stranger wrote, or garbage, fails
the check. A value is only ever replayed to its own key in its own job; the protocol's keys
name the generation or incarnation they are about where that matters.

:class:`SignedStore` is the one reader: a value that is missing, not signed, or does not parse
as what the key holds is treated as absent, with one warning per key naming it (never a
crash). A handle without the secret (``secret=None``: ``rankwise store``, which never holds
it) reads the value part without checking it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

__all__ = ["NO_VALUE", "SignedStore", "parse_count", "parse_slots", "read_raw"]

T = TypeVar("T")

_DOMAIN = b"rankwise-store-v1"
_MAC_HEX = 64  # hex digits of an HMAC-SHA256
# compare_set(key, s, s) answers the value without waiting: a missing key gives s back and
# stays missing, any other value is given back unchanged. Two sentinels: a key that holds the
# first (anyone may write it) gives the first back only once.
NO_VALUE = ("\x00rankwise: no value\x00", "\x00rankwise: no value either\x00")
_MAX_INT_DIGITS = 18  # any count the protocol keeps fits; more is garbage, not a number


def parse_slots(text: str) -> list[int] | None:
    """``"0,2"`` as ``[0, 2]`` (``""``: none); None where it is not such a list.

    >>> parse_slots("0,2"), parse_slots(""), parse_slots("x")
    ([0, 2], [], None)
    """
    if not text:
        return []
    parts = text.split(",")
    if not all(p.isdigit() and p.isascii() and len(p) <= 9 for p in parts):
        return None
    return [int(p) for p in parts]


def parse_count(text: str) -> int | None:
    """``text`` as a whole number >= 0, or None (garbage, or too long to be a count)."""
    if text.isdigit() and text.isascii() and len(text) <= _MAX_INT_DIGITS:
        return int(text)
    return None


def read_raw(store: dist.Store, key: str) -> bytes | None:
    """The bytes stored under ``key`` (None: not set), read without ever waiting for a missing
    key (see :meth:`SignedStore.raw`).

    >>> store = dist.HashStore(); store.set("k", b"v")
    >>> read_raw(store, "k"), read_raw(store, "nothing"), store.check(["nothing"])
    (b'v', None, False)
    """
    # On torch's libuv server such a compare_set of a missing key wakes every client that
    # waits for the key (which then reads b""): nobody waits for a protocol key, they poll it.
    for sentinel in NO_VALUE:
        value = bytes(store.compare_set(key, sentinel, sentinel))
        if value != sentinel.encode():
            return value
    return None


class SignedStore:
    """The job's store with every value signed (see the module doc).

    ``secret``: the job's secret as hex (``RANKWISE_JOB_TOKEN``; ``""`` where none was given:
    values are then checked for their form only); None: read without checking (a handle that
    never holds the secret). ``job``: the job's id (``RANKWISE_JOB_ID``). ``who``: the
    program named in the warnings (``rankwise``, ``rankwise launch``).

    >>> store = dist.HashStore()
    >>> signed = SignedStore(store, "ab" * 16, job="j1")
    >>> signed.set("dead/1", "0"); signed.get_int("dead/1")
    0
    >>> store.set("dead/1", "5")          # a stranger's write: not signed
    >>> signed.get_int("dead/1") is None  # ignored, with one warning naming the key
    True
    """

    def __init__(
        self, store: dist.Store, secret: str | None, job: str = "", who: str = "rankwise"
    ) -> None:
        self.store, self.job, self.who = store, job, who
        self._key = None if secret is None else bytes.fromhex(secret)
        self._warned: set[str] = set()

    # -- the format -------------------------------------------------------------------------

    def _mac(self, key: str, value: str) -> str:
        assert self._key is not None
        message = b"\0".join([_DOMAIN, self.job.encode(), key.encode(), value.encode()])
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def seal(self, key: str, value: str) -> str:
        """``value`` as stored under ``key``: with its signature appended."""
        assert self._key is not None, "a handle without the job's secret only reads"
        return f"{value}|{self._mac(key, value)}"

    def open(self, key: str, raw: bytes | None) -> str | None:
        """The value ``raw`` (as read from ``key``) holds, or None where it is absent or not
        signed with this job's secret (warned once per key)."""
        text = self._text(key, raw)
        if text is None:
            return None
        value, bar, mac = text.rpartition("|")
        if not bar or len(mac) != _MAC_HEX:
            return self.ignore(key, "it is not a signed value")
        if self._key is not None and not hmac.compare_digest(mac, self._mac(key, value)):
            return self.ignore(key, "its signature does not match this job's secret")
        return value

    def ignore(self, key: str, why: str) -> Any:
        """Say once per key that its value is ignored, and why; None (the value read)."""
        if key not in self._warned:
            self._warned.add(key)
            print(
                f"{self.who}: ignored the value of the store key {key!r} ({why}): it was not "
                "written by this job's own processes (a process given another job's secret "
                "or --job-token-file, or anyone else who reaches the store's port). The job "
                "goes on as if it were not set; keep the store's port on a private network "
                "(docs/continue.md, threat model).",
                file=sys.stderr,
                flush=True,
            )
        return None

    # -- reading ----------------------------------------------------------------------------

    def raw(self, key: str) -> bytes | None:
        """The bytes stored under ``key`` as they are (None: not set).

        One ``compare_set`` that changes nothing, never ``check`` then ``get``: a ``get``
        waits for a missing key up to the store's timeout, so a key deleted between the two
        (by the protocol, or by anyone who reaches the port) held this process that long."""
        return read_raw(self.store, key)

    def get(self, key: str) -> str | None:
        """The signed value of ``key``, or None (not set, or ignored: see :meth:`open`)."""
        return self.open(key, self.raw(key))

    def get_int(self, key: str) -> int | None:
        """``key``'s signed value as a whole number >= 0, or None (warned where it is not)."""
        return self._as(key, self.get(key), parse_count, "not a whole number")

    def get_slots(self, key: str) -> list[int] | None:
        """``key``'s signed value as a list of slots (``"0,2"``), or None."""
        return self._as(key, self.get(key), parse_slots, "not a list of slots")

    def plain(self, key: str, parse: Callable[[str], T | None], what: str) -> T | None:
        """An *unsigned* key (a join request, which a process with the wrong secret writes
        too): its value parsed by ``parse``, or None where it is absent or does not parse."""
        text = self._text(key, self.raw(key))
        return None if text is None else self._as(key, text, parse, what)

    def _text(self, key: str, raw: bytes | None) -> str | None:
        """``raw`` as text (None: absent, or not text, warned once per key)."""
        if raw is None:
            return None
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return self.ignore(key, "it is not text")

    def _as(
        self, key: str, value: str | None, parse: Callable[[str], T | None], what: str
    ) -> T | None:
        if value is None:
            return None
        parsed = parse(value)
        return self.ignore(key, f"{what}: {value[:40]!r}") if parsed is None else parsed

    def has(self, key: str) -> bool:
        """Whether ``key`` holds a signed value (a flag such as ``stopped``)."""
        return self.get(key) is not None

    # -- writing ----------------------------------------------------------------------------

    def set(self, key: str, value: str) -> None:
        """Write ``value`` to ``key``, signed."""
        self.store.set(key, self.seal(key, value))

    def delete(self, key: str) -> None:
        """Remove ``key`` (a used proof, a used challenge)."""
        with contextlib.suppress(Exception):  # gone already, or the store: said elsewhere
            self.store.delete_key(key)

    def claim(self, key: str, value: str, tries: int = 50) -> str | None:
        """Write ``value`` to ``key`` unless a signed value is there already; the value that
        stays (``value`` where this call wrote it). Garbage there is replaced, not obeyed."""
        mine = self.seal(key, value)
        expected: Any = ""  # bytes where garbage is there: torch takes either
        for _ in range(tries):
            got = self.store.compare_set(key, expected, mine)
            if got == mine.encode():
                return value
            held = self.open(key, got)
            if held is not None:
                return held
            raw = self.raw(key)  # garbage, or deleted since: replace exactly what is there
            expected = "" if raw is None else raw
        return None
