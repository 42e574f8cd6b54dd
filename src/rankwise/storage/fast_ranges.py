"""The ranged-GET client for S3 where it is fastest: obstore (Rust ``object_store``), when it is
installed, for :meth:`Storage.read_ranges <rankwise.storage.Storage.read_ranges>`.

Measured here against a local SeaweedFS (benchmarks/RESULTS.md, "Data in object storage"): 2,500
ranged GETs of 1.3 KB, 64 in flight, took 3.8 s and 0.85 s of client CPU through obstore
against 17.4 s and 5.2 s through s3fs ``cat_ranges`` on a loaded 2-core host. One GET per range
(``get_range_async``), never obstore's ``get_ranges``, which coalesces ranges up to 1 MiB apart
into one large GET.

obstore's runtime does not survive a fork: a process that used it and forks leaves the child
hanging on its first request (measured: a forked child's GET never returned). So the storage
uses it only when the caller says the process will not fork (``fork_safe=False``):
FetchDataset does inside DataLoader workers, which never fork; everywhere else, s3fs reads.

Credentials and endpoint: obstore reads the ``AWS_*`` variables itself (as botocore does);
``storage_options`` (``endpoint_url``, ``key``, ``secret``, ``token``, ``client_kwargs``'
``endpoint_url`` / ``region_name``) override them; a read timeout of ``config_kwargs``'
``read_timeout`` (30 s by default); no retries of its own (rankwise retries, with backoff).
Only where that is all it takes (:func:`available`): credentials from a profile, ``~/.aws``,
SSO or a session, and any other client option, are read through s3fs, as botocore reads them.

One event loop per client, in a daemon thread of the process that made it, runs every read:
an ``asyncio.run`` per read (a new loop each time) cost ~0.2 s a call here, measured: 25 reads
of 4 x 1 MiB took 5.4-7.5 s that way, 0.63-0.84 s on one loop kept.

Module state: none (each storage holds its own :class:`RangedClient`, per process).
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from rankwise.distributed.environment import aws_client_variables

__all__ = ["RangedClient", "available", "s3_store"]

# storage_options (s3fs's names) that obstore cannot be told: with one of them set, s3fs reads.
_UNMAPPED = {"anon", "profile", "requester_pays", "use_ssl", "session", "default_block_size"}
# The client_kwargs / config_kwargs keys :func:`s3_store` gives obstore; any other one, s3fs.
_MAPPED_CLIENT = {"endpoint_url", "region_name"}
_MAPPED_CONFIG = {"read_timeout"}


def available(protocol: str, options: dict[str, Any], env: Mapping[str, str] | None = None) -> bool:
    """Whether obstore is installed and authenticates to this S3 storage exactly as s3fs would.

    Only where nothing but what obstore reads itself is needed: the credentials in ``options``
    (``key``/``secret``) or in ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``; no option or
    ``client_kwargs``/``config_kwargs`` key obstore cannot be given; a region known
    (``AWS_REGION``, ``AWS_DEFAULT_REGION``, an option) or an endpoint given. Otherwise s3fs
    reads (botocore's ``~/.aws`` files, profiles, SSO, region redirects).

    >>> keys = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "x"}
    >>> available("s3", {}, keys) == _installed(), available("s3", {}, {"AWS_PROFILE": "p"})
    (True, False)
    """
    if not protocol.startswith("s3") or not _installed():
        return False
    env = aws_client_variables() if env is None else env
    client, config = options.get("client_kwargs") or {}, options.get("config_kwargs") or {}
    if any(name in options for name in _UNMAPPED):
        return False
    if set(client) - _MAPPED_CLIENT or set(config) - _MAPPED_CONFIG:
        return False
    keys = options.get("key") and options.get("secret")
    if not keys and not (env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY")):
        return False
    region = client.get("region_name") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    return bool(region or endpoint or env.get("AWS_ENDPOINT_URL"))


def _installed() -> bool:
    return importlib.util.find_spec("obstore") is not None


def s3_store(bucket: str, options: dict[str, Any], region: str | None, read_timeout: float) -> Any:
    """An obstore ``S3Store`` for ``bucket``: the ``AWS_*`` variables, then ``options``."""
    from obstore.store import S3Store

    client = dict(options.get("client_kwargs", {}))
    config: dict[str, Any] = {}
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    if endpoint:
        config["endpoint"] = endpoint
    for ours, theirs in (
        ("key", "access_key_id"),
        ("secret", "secret_access_key"),
        ("token", "session_token"),
    ):
        if options.get(ours):
            config[theirs] = options[ours]
    region = client.get("region_name") or region
    if region:
        config["region"] = region
    return S3Store(
        bucket,
        **config,
        client_options={
            "allow_http": True,  # an http:// endpoint the user configured, as s3fs allows
            # A stall limit that resets after each successful read, never a whole-request
            # limit: a large healthy merged download is not cut off ("timeout", obstore's
            # whole-request limit, 30 s by default, is set out of reach).
            "read_timeout": f"{read_timeout}s",
            "timeout": "365d",
            "connect_timeout": "5s",
        },
        retry_config={"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=read_timeout)},
    )


class RangedClient:
    """An obstore store and the event loop its reads run on: a daemon thread started on the
    first read, in the process that reads (a storage makes its client per process, so a loop
    never crosses a fork). Thread-safe: a worker's prefetch threads share it."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="rankwise-ranges", daemon=True
                ).start()
                self._loop = loop
            return self._loop

    def get_ranges(
        self, path: str, ranges: Sequence[tuple[int, int]], in_flight: int, copy: bool = True
    ) -> list[Any]:
        """The bytes of each ``[start, stop)`` of ``path``, one GET each, ``in_flight`` at
        once; ``copy=False``: read-only buffers over obstore's own memory (no copy of a
        large range). A store that stops answering ends in obstore's read timeout."""
        import obstore

        store = self.store

        async def all_ranges() -> list[Any]:
            gate = asyncio.Semaphore(in_flight)

            async def one(start: int, stop: int) -> Any:
                async with gate:
                    return await obstore.get_range_async(store, path, start=start, end=stop)

            return await asyncio.gather(*(one(a, b) for a, b in ranges))

        done = asyncio.run_coroutine_threadsafe(all_ranges(), self._running_loop())
        return [bytes(b) if copy else memoryview(b) for b in done.result()]
