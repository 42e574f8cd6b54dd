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

Module state: none (each storage holds its own obstore store, per process).
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
from collections.abc import Sequence
from typing import Any

__all__ = ["available", "get_ranges", "s3_store"]

# storage_options (s3fs's names) that obstore cannot be told: with one of them set, s3fs reads.
_UNMAPPED = {"anon", "profile", "requester_pays", "use_ssl", "session", "default_block_size"}


def available(protocol: str, options: dict[str, Any]) -> bool:
    """Whether obstore is installed and can reach this S3 storage as its options describe."""
    if not protocol.startswith("s3") or importlib.util.find_spec("obstore") is None:
        return False
    return not any(name in options for name in _UNMAPPED - {"session"})


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
            "timeout": f"{read_timeout}s",
            "connect_timeout": "5s",
        },
        retry_config={"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=read_timeout)},
    )


def get_ranges(
    store: Any, path: str, ranges: Sequence[tuple[int, int]], in_flight: int
) -> list[bytes]:
    """The bytes of each ``[start, stop)`` of ``path``, one GET each, ``in_flight`` at once."""
    import obstore

    async def all_ranges() -> list[Any]:
        gate = asyncio.Semaphore(in_flight)

        async def one(start: int, stop: int) -> Any:
            async with gate:
                return await obstore.get_range_async(store, path, start=start, end=stop)

        return await asyncio.gather(*(one(a, b) for a, b in ranges))

    return [bytes(b) for b in asyncio.run(all_ranges())]
