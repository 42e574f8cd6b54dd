"""One store interface behind a URL: a local folder, or an object store through fsspec.

:meth:`Storage.for_url` takes what ``checkpoint_dir`` may hold. A local path or a ``file://``
URL gives a local storage (``is_remote`` is false, ``local_path`` is the folder) whose every
write goes to a temporary name, is fsynced and renamed into place (``local.LocalFiles``). Any
other fsspec URL (``s3://``, ``gs://``, ``az://``, ``memory://``) gives a remote storage. Keys
are names under the URL, and both answer the same calls:

>>> store = Storage.for_url("memory://rankwise-doc/run")
>>> store.is_remote, store.put(b"abc", "x.bin"), store.read("x.bin"), store.names()
(True, 3, b'abc', ['x.bin'])
>>> import tempfile
>>> folder = Storage.for_url(tempfile.mkdtemp())
>>> folder.is_remote, folder.put(b"abc", "x.bin"), folder.read("x.bin"), folder.names()
(False, 3, b'abc', ['x.bin'])

A remote storage is safe in a forked process (a DataLoader worker): the first call there
builds the process's own client, never sharing the parent's connections or event loop.

Endpoint and credentials come from where the users' other tools read them (for S3: the
``AWS_*`` variables, ``~/.aws`` files, instance roles, as botocore reads them), plus
``storage_options`` (the fsspec keyword arguments) for the rest. Every failure raises
:class:`StorageError` naming the URL, the cause and the fix, never a credential; a transient
one (endpoint unreachable, connection lost, a 5xx) is retried with exponential backoff first
(:class:`RetryPolicy`), each retry announced by a :class:`StorageWarning`.

One concept in one file past 600 lines: every call a layer above makes on a store (read,
ranged read, write, upload, stat, list, delete), each through the same retry, scrubbing and
per-process client; what differs by backend lives beside it (``local.py``, ``fast_ranges.py``).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import functools
import importlib
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rankwise.distributed.environment import aws_region
from rankwise.storage import fast_ranges
from rankwise.storage.errors import StorageError, StorageWarning
from rankwise.storage.local import LocalFiles, remove_tree
from rankwise.storage.ranges import merge_ranges, split_merged
from rankwise.storage.retry import RetryPolicy, retrying
from rankwise.storage.secrets import scrub, secret_values
from rankwise.storage.urls import split_url

__all__ = ["ObjectStat", "Storage"]

T = TypeVar("T")

# The fsspec backends that are not part of fsspec itself, and the extra or package bringing each.
_BACKENDS = {
    "s3": ("s3fs", 'pip install "rankwise[s3]"'),
    "s3a": ("s3fs", 'pip install "rankwise[s3]"'),
    "gs": ("gcsfs", "pip install gcsfs"),
    "gcs": ("gcsfs", "pip install gcsfs"),
    "az": ("adlfs", "pip install adlfs"),
    "abfs": ("adlfs", "pip install adlfs"),
}
# S3 defaults, under the user's own config_kwargs: a dead endpoint fails in seconds (botocore's
# defaults retry a refused connection for ~10 s, a silent one for minutes), and so does a store
# that takes a request but never answers (a frozen server: read_timeout, counted from the end
# of the request's body); rankwise retries transient faults itself, with backoff and a warning
# naming the URL.
_S3_CONFIG = {
    "connect_timeout": 5,
    "read_timeout": 30,
    "retries": {"total_max_attempts": 1, "mode": "standard"},
}
# Upload parts: s3fs holds max_concurrency parts in memory at once; 8 x 32 MiB (256 MiB) beside
# training instead of its default 10 x 50 MiB (500 MiB). Not slower: 300 MB to a local SeaweedFS
# took a median 3.65 s against 3.97 s for s3fs's defaults (4 runs each, on a loaded 2-core host,
# within noise of each other).
PART_SIZE = 32 << 20
PARALLEL_PARTS = 8
# Ranged GETs on the wire at once per read_ranges call (s3fs's gather batch).
IN_FLIGHT = 64
# The fields of an fsspec ``info()`` that name an object's version (whichever a backend gives:
# S3's version id and ETag, GCS's generation, Azure's etag), each changing whenever the
# object is written. memory:// gives none of them; its ``created`` (the write's time, in
# microseconds) is what it has.
VERSION_FIELDS = ("VersionId", "version_id", "ETag", "etag", "e_tag", "generation")
MEMORY_VERSION_FIELDS = ("created",)
# A local file whose mtime is this recent may be written again within the same tick of the
# filesystem's clock (ext4: a jiffy; FAT: 2 s), keeping size, inode and mtime: its tag then
# holds only for this open (a random part is added), never for a later one.
RACY_NS = 2_000_000_000
# The clients a forked process inherited and replaced with its own (see Storage._fs): held for
# the process's life so that no finalizer of theirs runs in it.
_INHERITED: list[Any] = []


@dataclass(frozen=True)
class ObjectStat:
    """An object's ``size`` in bytes and ``version``: a tag that differs whenever the object
    was written again (S3's version id or ETag, a local file's mtime, size and inode), or
    ``None`` where the store gives no such tag (then nothing tells a rewrite apart)."""

    size: int
    version: str | None


class Storage:
    """Where checkpoints live: a local folder or a prefix of an object store (see the module).

    Build it with :meth:`for_url`. Keys are ``/``-separated names under the URL. Every remote
    operation retries transient failures under ``retry`` and raises :class:`StorageError`
    naming the URL when it gives up; reading a missing key raises ``FileNotFoundError``.
    """

    def __init__(
        self,
        url: str,
        protocol: str,
        path: str,
        fs: Any = None,
        *,
        make_fs: Callable[[], Any] | None = None,
        make_ranged: Callable[[], Any] | None = None,
        retry: RetryPolicy | None = None,
        secrets: Iterable[str] = (),
        part_size: int = PART_SIZE,
        parallel_parts: int = PARALLEL_PARTS,
    ) -> None:
        if part_size < 5 << 20 or parallel_parts < 1:
            raise ValueError(
                f"part_size ({part_size}) must be >= 5 MiB (S3's smallest part) and "
                f"parallel_parts ({parallel_parts}) >= 1."
            )
        self.part_size = part_size
        self.parallel_parts = parallel_parts
        self.url = url
        self.protocol = protocol
        self.path = path
        self.fs = fs if fs is not None else LocalFiles()
        self._make_fs = make_fs  # builds a forked process's own client (remote only)
        self._pid = os.getpid()  # the process self.fs was made in
        # obstore's store for ranged reads where it may be used (fast_ranges.py), per process
        self._make_ranged = make_ranged
        self._ranged: tuple[int, Any] | None = None
        self._ranged_lock = threading.Lock()  # a worker's prefetch threads make it once
        self.retry = retry or RetryPolicy()
        self._secrets = list(secrets)
        self._in_outage = False  # a retry was announced and no call has succeeded since
        self.answered_at = 0.0  # time.monotonic() of the last call that succeeded
        self.requests = 0  # ranged reads this process made (read_ranges), after merging
        self.bytes_read = 0

    @classmethod
    def for_url(
        cls,
        url: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
        part_size: int = PART_SIZE,
        parallel_parts: int = PARALLEL_PARTS,
    ) -> Storage:
        """The storage ``url`` names; ``storage_options`` go to the fsspec filesystem
        (for S3: ``endpoint_url``, ``key``, ``secret``, ``client_kwargs``, ``config_kwargs``
        ...); ``retry`` governs transient failures; ``part_size`` and ``parallel_parts`` shape
        multipart uploads. Nothing is contacted yet: :meth:`check_writable` does that."""
        url = os.fspath(url)
        protocol, path = split_url(url)
        if protocol == "file":
            return cls(url, "file", path or ".", retry=retry)
        sizes = {"part_size": part_size, "parallel_parts": parallel_parts}
        options = dict(storage_options or {})
        user_options = dict(options)
        secrets = secret_values(options)
        module, fix = _BACKENDS.get(protocol, ("fsspec", 'pip install "rankwise[s3]"'))
        try:
            fsspec = importlib.import_module("fsspec")
            importlib.import_module(module)
            fs_class = fsspec.get_filesystem_class(protocol)
        except ImportError as e:
            raise StorageError(
                f"checkpoints at {scrub(url, secrets)} need {module}, which is not "
                f"installed ({e.msg}): {fix}.",
                url=url,
                reason="missing-backend",
            ) from None
        except ValueError as e:  # fsspec knows no such protocol
            raise StorageError(
                f"checkpoint URL {url!r}: {e}; use a local path or an fsspec URL (s3://, "
                "gs://, az://, memory://).",
                url=url,
                reason="bad-url",
            ) from None
        if module == "s3fs":
            config = {**_S3_CONFIG, **options.get("config_kwargs", {})}
            client = dict(options.get("client_kwargs", {}))
            region = aws_region()
            if region is not None and "region_name" not in client:
                client["region_name"] = region
            options = {
                "skip_instance_cache": True,
                **options,
                "config_kwargs": config,
                "client_kwargs": client,
            }

        if module == "s3fs" and "session" not in options:
            # One botocore session for every client of this storage: a forked DataLoader
            # worker's new client then reuses the parsed S3 service model instead of loading
            # it again (0.5-0.9 s of CPU per worker measured here). A session holds no
            # connection and no event loop; the clients made from it are per process.
            from aiobotocore.session import AioSession

            options["session"] = AioSession()

        def make_fs() -> Any:
            fs = fs_class(**options)
            if module == "s3fs":
                # One layer of retries, rankwise's (backoff, a warning naming the URL): s3fs's
                # own would retry each try 5 more times, silently.
                fs.retries = 1
            return fs

        make_ranged = None
        if module == "s3fs" and fast_ranges.available(protocol, user_options):
            bucket, timeout = path.split("/", 1)[0], float(options["config_kwargs"]["read_timeout"])

            def make_ranged() -> Any:
                store = fast_ranges.s3_store(bucket, user_options, aws_region(), timeout)
                return fast_ranges.RangedClient(store)

        return cls(
            url,
            protocol,
            path,
            make_fs(),
            make_fs=make_fs,
            make_ranged=make_ranged,
            retry=retry,
            secrets=secrets,
            **sizes,
        )

    @property
    def is_remote(self) -> bool:
        """False for a local folder (whose path is :attr:`local_path`)."""
        return self.protocol != "file"

    @property
    def local_path(self) -> Path:
        """The local folder (for a local storage only)."""
        if self.is_remote:
            raise TypeError(f"{self.url} is remote storage; it has no local path.")
        return Path(self.path)

    def __repr__(self) -> str:
        return f"Storage({self.display_url!r})"

    @property
    def display_url(self) -> str:
        """The URL as messages show it (credentials scrubbed; a local folder's path)."""
        if not self.is_remote:
            return str(self.local_path)
        return self._scrub(self.url)

    def url_of(self, key: str) -> str:
        """The URL of ``key`` (credentials scrubbed; a local file's path)."""
        if not self.is_remote:
            return str(self.local_path / key)
        return f"{self.display_url.rstrip('/')}/{key}"

    def _full(self, key: str) -> str:
        return f"{self.path}/{key}" if key else self.path

    def _scrub(self, text: str) -> str:
        return scrub(text, self._secrets)

    def _fs(self) -> Any:
        """The filesystem, this process's own: a forked child (a DataLoader worker) builds
        its client anew rather than use the parent's connections and event loop."""
        if self._make_fs is not None and os.getpid() != self._pid:
            # The parent's client is kept, never closed here: closing it would unregister its
            # sockets from the event loop's epoll, which parent and child share after a fork,
            # and the parent's next read would wait for an answer it is never told of.
            _INHERITED.append(self.fs)
            self.fs, self._pid = self._make_fs(), os.getpid()
        return self.fs

    def call(
        self, what: str, key: str, op: Callable[[], T], *, retry: RetryPolicy | None = None
    ) -> T:
        """Run ``op`` (an operation on ``key``), retrying transient failures with backoff
        (:func:`~rankwise.storage.retry.retrying`). A local folder's calls are not retried
        (there is nothing transient to wait out); a missing key is ``FileNotFoundError``."""
        self._fs()
        if not self.is_remote:
            try:
                return op()
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.url_of(key)} does not exist.") from None
        result = retrying(
            op,
            what=f"{what} {self.url_of(key)}",
            url=self.display_url,
            policy=retry or self.retry,
            scrub=self._scrub,
            announce=self._announce,
        )
        self._in_outage = False
        self.answered_at = time.monotonic()
        return result

    def _announce(self, message: str) -> None:
        """One :class:`StorageWarning` per outage (its first retry), not one per retry: a
        store down for minutes would otherwise bury the log."""
        if not self._in_outage:
            self._in_outage = True
            warnings.warn(
                f"{message} Further retries under {self.display_url} stay silent until a "
                "call succeeds.",
                StorageWarning,
                stacklevel=5,
            )

    def put(
        self,
        source: bytes | memoryview | str | os.PathLike[str],
        key: str,
        *,
        retry: RetryPolicy | None = None,
        uploaded: Callable[[int], None] | None = None,
    ) -> int:
        """Upload ``source`` (bytes, or a local file's path) to ``key``; return its size.

        Objects of two parts or more go up as a multipart upload of ``part_size`` parts,
        ``parallel_parts`` at a time (S3); a failed try is retried whole. ``uploaded(n)`` is
        called as a file's bytes go up (``n`` of them: a part, or the whole object)."""
        fs = self._fs()
        extra: dict[str, Any] = {
            "chunksize": self.part_size,
            "max_concurrency": self.parallel_parts,
        }
        if not self.protocol.startswith("s3"):
            extra = {}
        if self.is_remote and not isinstance(source, (bytes, bytearray, memoryview)):
            extra["callback"] = _progress(self, uploaded)
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
            self.call(
                "upload to", key, lambda: fs.pipe_file(self._full(key), data, **extra), retry=retry
            )
            return len(data)
        local = os.fspath(source)
        self.call(
            "upload to", key, lambda: fs.put_file(local, self._full(key), **extra), retry=retry
        )
        size = os.path.getsize(local)
        if not self.is_remote and uploaded is not None:  # a local copy reports once, whole
            uploaded(size)
        return size

    def read(self, key: str) -> bytes:
        """The bytes of ``key``."""
        fs = self._fs()
        return bytes(self.call("read", key, lambda: fs.cat_file(self._full(key))))

    def read_ranges(
        self,
        key: str,
        ranges: Sequence[tuple[int, int]],
        *,
        max_gap: int = 0,
        in_flight: int = IN_FLIGHT,
        fork_safe: bool = True,
        buffers: bool = False,
    ) -> list[Any]:
        """The bytes ``[start, stop)`` of ``key`` for each of ``ranges``, in their order.

        Ranges that touch (or are at most ``max_gap`` bytes apart) go as one request, and up
        to ``in_flight`` requests are on the wire at once; a transient failure retries the
        whole read with backoff. A store that stops answering fails after the client's read
        timeout (S3: ``config_kwargs={"read_timeout": ...}``, 30 s by default), never hangs.
        :attr:`requests` and :attr:`bytes_read` count what this process asked of the store.
        ``fork_safe=False`` (the caller's process never forks: a DataLoader worker) lets an S3
        storage read through obstore where it is installed, ~4x cheaper per GET
        (:mod:`rankwise.storage.fast_ranges`). ``buffers=True``: each answer may be a
        read-only buffer (a ``memoryview``) instead of ``bytes``, saving a copy of every byte
        read (what FetchDataset's reads take).

        >>> store = Storage.for_url("memory://rankwise-doc/ranges")
        >>> _ = store.put(b"0123456789", "x.bin")
        >>> store.read_ranges("x.bin", [(6, 8), (0, 2), (2, 3)]), store.requests
        ([b'67', b'01', b'2'], 2)
        """
        merged = merge_ranges(ranges, max_gap)
        if not merged:
            return [b"" for _ in ranges]
        fs, path = self._fs(), self._full(key)
        extra: dict[str, Any] = {"on_error": "raise"} if self.is_remote else {}
        if self.protocol.startswith("s3"):
            extra["batch_size"] = in_flight
        store = None if fork_safe else self._ranged_store()

        def read() -> list[bytes]:
            if store is not None:
                key_path = path.split("/", 1)[1]
                return store.get_ranges(key_path, merged, in_flight, copy=not buffers)
            starts, stops = [m[0] for m in merged], [m[1] for m in merged]
            return list(fs.cat_ranges([path] * len(merged), starts, stops, **extra))

        data = self.call("read", key, read)
        self._count_read(key, len(merged), sum(map(len, data)), sum(b - a for a, b in merged))
        return split_merged(ranges, merged, data, copy=not buffers)

    def read_ranges_into(
        self,
        key: str,
        ranges: Sequence[tuple[int, int]],
        into: Any,
        *,
        fork_safe: bool = True,
    ) -> None:
        """The bytes of each of ``ranges`` of ``key``, end to end in their order, written into
        ``into`` (a writable buffer of exactly their total length). A local file's are read
        straight into their place (no copy in between: a dense fetch read locally cost a
        third more through :meth:`read_ranges` and a join); a remote store's are read as
        :meth:`read_ranges` reads them (merged), then copied in. Counted in :attr:`requests`
        and :attr:`bytes_read`: locally one request per run of ranges that follow each other
        in the file in the order given, and overlapping bytes once per range that holds them
        (FetchDataset's ranges are sorted and disjoint: the same counts as a remote store's).

        >>> import tempfile
        >>> folder = Storage.for_url(tempfile.mkdtemp())
        >>> _, out = folder.put(b"0123456789", "x.bin"), bytearray(5)
        >>> folder.read_ranges_into("x.bin", [(6, 8), (0, 2), (2, 3)], out)
        >>> bytes(out), folder.requests
        (b'67012', 2)
        """
        view = memoryview(into).cast("B")
        want = sum(max(b - a, 0) for a, b in ranges)
        if len(view) != want:
            raise ValueError(f"into holds {len(view)} bytes; the ranges hold {want}.")
        if self.is_remote:
            at = 0
            for (a, b), piece in zip(
                ranges, self.read_ranges(key, ranges, fork_safe=fork_safe, buffers=True),
                strict=True,
            ):  # fmt: skip
                view[at : at + max(b - a, 0)] = piece
                at += max(b - a, 0)
            return
        runs: list[tuple[int, int, int]] = []  # (file offset, into offset, length)
        at = 0
        for a, b in ranges:
            if b <= a:
                continue
            if runs and runs[-1][0] + runs[-1][2] == a and runs[-1][1] + runs[-1][2] == at:
                runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + b - a)
            else:
                runs.append((a, at, b - a))
            at += b - a
        if not runs:
            return  # nothing to read: the store is not asked (as read_ranges does)

        def read() -> int:
            got = 0
            with open(self._full(key), "rb", buffering=0) as f:
                for offset, start, length in runs:
                    f.seek(offset)
                    part = view[start : start + length]
                    done = 0
                    while done < length and (n := f.readinto(part[done:])):
                        done += n
                    got += done
            return got

        self._count_read(key, len(runs), self.call("read", key, read), want)

    def _count_read(self, key: str, requests: int, got: int, want: int) -> None:
        """Count a ranged read, or refuse one that came back short."""
        if got != want:
            raise StorageError(
                f"read {self.url_of(key)}: got {got} bytes for ranges of {want}; the object "
                "is shorter than its header says (truncated or replaced while being read): "
                "rewrite it.",
                url=self.display_url,
                reason="failed",
            )
        self.requests += requests
        self.bytes_read += got

    def _ranged_store(self) -> Any:
        """This process's obstore store, or None where obstore does not serve this storage."""
        if self._make_ranged is None:
            return None
        with self._ranged_lock:
            if self._ranged is None or self._ranged[0] != os.getpid():
                self._ranged = (os.getpid(), self._make_ranged())
            return self._ranged[1]

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_ranged_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._ranged_lock = threading.Lock()  # a lock is never copied or pickled

    def open_read(self, key: str) -> Any:
        """A binary file object reading ``key`` (for streaming large objects)."""
        fs = self._fs()
        return self.call("open", key, lambda: fs.open(self._full(key), "rb"))

    def download(self, key: str, dest: str | os.PathLike[str]) -> Path:
        """Copy ``key`` to the local file ``dest``; return its path."""
        fs = self._fs()
        self.call("download", key, lambda: fs.get_file(self._full(key), os.fspath(dest)))
        return Path(dest)

    def size(self, key: str) -> int:
        """The size of ``key`` in bytes."""
        fs = self._fs()
        return int(self.call("stat", key, lambda: fs.size(self._full(key))))

    def stat(self, key: str) -> ObjectStat:
        """The size and version tag of ``key`` (:class:`ObjectStat`; a missing key raises
        ``FileNotFoundError``). Local files: ``mtime_ns``, size, inode and device (a file
        modified under 2 s ago gets a tag valid for this call only, since a second write in the
        same clock tick could keep all four); object stores: the version id and ETag (or
        generation) fsspec reports; memory://: the write's time.

        >>> store = Storage.for_url("memory://rankwise-doc/stat")
        >>> _ = store.put(b"abc", "x.bin"); first = store.stat("x.bin")
        >>> _ = store.put(b"abd", "x.bin"); second = store.stat("x.bin")
        >>> first.size == second.size == 3, first.version != second.version
        (True, True)
        """
        fs = self._fs()
        if not self.is_remote:
            st = self.call("stat", key, lambda: os.stat(self._full(key)))
            return ObjectStat(int(st.st_size), local_version(st))
        extra = {"refresh": True} if self.protocol.startswith("s3") else {}
        info = self.call("stat", key, lambda: fs.info(self._full(key), **extra))
        fields = VERSION_FIELDS + (MEMORY_VERSION_FIELDS if self.protocol == "memory" else ())
        return ObjectStat(int(info["size"]), remote_version(info, fields))

    def exists(self, key: str) -> bool:
        fs = self._fs()
        return bool(self.call("stat", key, lambda: fs.exists(self._full(key))))

    def names(self, *, folders: bool = False) -> list[str]:
        """The names of the objects directly under the URL, sorted (no sub-folders); with
        ``folders``, the names of the sub-folders instead (prefixes holding objects)."""
        fs = self._fs()
        try:
            # refresh: another writer may have added objects since a cached listing
            found = self.call("list", "", lambda: fs.ls(self.path, detail=True, refresh=True))
        except FileNotFoundError:  # nothing under the prefix yet (a missing bucket is an error)
            return []
        return sorted(
            str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
            for info in found
            if (info.get("type") == "directory") == folders
        )

    def child(self, name: str) -> Storage:
        """The storage of the sub-folder ``name`` (same filesystem, retries and secrets).

        >>> Storage.for_url("memory://rankwise-doc/run").child("ckpt.dcp").url
        'memory://rankwise-doc/run/ckpt.dcp'
        """
        child = copy.copy(self)
        child.url = f"{self.url.rstrip('/')}/{name}"
        child.path = self._full(name)
        child._in_outage = False
        return child

    def delete(self, *keys: str) -> None:
        """Delete ``keys`` (missing ones are fine)."""
        fs = self._fs()
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                self.call("delete", key, functools.partial(fs.rm_file, self._full(key)))

    def delete_folder(self, name: str, *, first: Iterable[str] = ()) -> None:
        """Delete the sub-folder ``name`` and everything in it (a missing one is fine). A local
        folder is renamed away first (atomic), then removed; in object storage, where there is
        no rename, the keys ``first`` go first (a manifest: a kill in between leaves objects no
        reader trusts), then the rest, then the folder's own entry (SeaweedFS keeps one)."""
        if not self.is_remote:
            remove_tree(self.local_path / name)
            return
        folder = self.child(name)
        folder.delete(*first)
        fs = self._fs()
        with contextlib.suppress(FileNotFoundError):  # the rest, and memory://'s folder entry
            self.call("delete", name, lambda: fs.rm(self._full(name), recursive=True))
        self.delete(name)

    def abort_uploads(self, *, older_than: float | None = None) -> list[str]:
        """Abort the unfinished multipart uploads under the URL (uploads a killed writer left:
        invisible, but stored and billed); return their keys. ``older_than`` (seconds) spares
        younger ones (an upload in flight elsewhere). Only S3 has them: elsewhere, ``[]``."""
        fs = self._fs()
        if not self.protocol.startswith("s3"):
            return []
        bucket, _, prefix = self.path.partition("/")
        prefix = f"{prefix}/" if prefix else ""
        now = datetime.datetime.now(datetime.timezone.utc)
        aborted = []
        for upload in self.call(
            "list uploads under", "", lambda: _list_uploads(fs, bucket, prefix)
        ):
            age = (now - upload["Initiated"]).total_seconds()
            if older_than is not None and age < older_than:
                continue
            key = upload["Key"]
            rel = key[len(prefix) :]
            abort = functools.partial(fs.abort_mpu, bucket, key, upload["UploadId"])
            self.call("abort upload", rel, abort)
            aborted.append(rel)
        return aborted

    def check_writable(self) -> None:
        """Write, read back and delete a small object under the URL, once (no retries), so a
        wrong URL, bucket, credential or endpoint fails before the first training step, in
        seconds, with :class:`StorageError` naming the URL and the fix."""
        if not self.is_remote:
            self.local_path.mkdir(parents=True, exist_ok=True)
            return
        key = f".rankwise-write-check-{uuid.uuid4().hex[:12]}"
        once = RetryPolicy(attempts=1)
        self.put(b"rankwise", key, retry=once)
        try:
            fs = self._fs()
            data = self.call("read", key, lambda: fs.cat_file(self._full(key)), retry=once)
            if data != b"rankwise":
                raise StorageError(
                    f"{self.url_of(key)} read back other bytes than were written.",
                    url=self.display_url,
                    reason="failed",
                )
        finally:
            self.call("delete", key, lambda: self._fs().rm_file(self._full(key)), retry=once)


def local_version(st: os.stat_result, now_ns: int | None = None) -> str:
    """A local file's version tag from its ``os.stat``: mtime (ns), size, inode and device;
    with a random part when the mtime is under :data:`RACY_NS` old (see :meth:`Storage.stat`)."""
    tag = f"mtime {st.st_mtime_ns} size {st.st_size} inode {st.st_ino} device {st.st_dev}"
    now_ns = time.time_ns() if now_ns is None else now_ns
    if st.st_mtime_ns > now_ns - RACY_NS:
        tag += f" open {uuid.uuid4().hex}"
    return tag


def remote_version(info: dict[str, Any], fields: Sequence[str] = VERSION_FIELDS) -> str | None:
    """The version tag in an fsspec ``info()``: its ``fields`` that are set, joined; None when
    none is (S3 reports an unversioned bucket's version id as ``"null"``)."""
    found = [
        f"{name} {info[name]}"
        for name in fields
        if info.get(name) is not None and str(info[name]) not in ("", "null")
    ]
    return "; ".join(found) if found else None


def _progress(storage: Storage, uploaded: Callable[[int], None] | None) -> Any:
    """An fsspec callback calling ``uploaded(n)`` for each ``n`` bytes an upload reports; each
    report is an answer of the store (``storage.answered_at``: a long upload is not silence)."""
    from fsspec.callbacks import Callback  # fsspec: present whenever a storage is remote

    class Progress(Callback):
        def relative_update(self, inc: int = 1) -> None:
            storage.answered_at = time.monotonic()
            if uploaded is not None:
                uploaded(inc)

    return Progress()


def _list_uploads(fs: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    """Every unfinished multipart upload under ``prefix`` (S3 pages them 1,000 at a time)."""
    uploads: list[dict[str, Any]] = []
    markers: dict[str, str] = {}
    while True:
        page = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix, **markers)
        uploads += page.get("Uploads", []) or []
        if not page.get("IsTruncated"):
            return uploads
        markers = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
