"""Checkpoint and data locations: a local path or an fsspec URL, checked up front so a URL that
cannot be meant as written fails at once, naming the fix.

>>> split_url("s3:/bucket/run")
Traceback (most recent call last):
...
rankwise.storage.errors.StorageError: checkpoint URL 's3:/bucket/run' is malformed: a URL starts with s3:// (two slashes); write s3://bucket/run.
"""

from __future__ import annotations

import os
import re

from rankwise.storage.errors import StorageError

_BUCKETED = {"s3", "s3a", "gs", "gcs", "az", "abfs"}  # a URL of these names a bucket first
_LOCAL = {"file", "local"}
# Object stores whose URL, with its colon (or a slash) left out, still reads as a relative path.
_STORES = _BUCKETED | {"abfss", "adl", "oci", "hf"}


def split_url(url: str) -> tuple[str, str]:
    """``(protocol, path)`` of a checkpoint location; a plain path is ``("file", path)``.

    Raises :class:`StorageError` (reason ``bad-url``) for a URL that cannot be meant as
    written, naming the fix.

    >>> split_url("s3://bucket/run"), split_url("runs/a")
    (('s3', 'bucket/run'), ('file', 'runs/a'))
    """
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):(/*)(.*)$", url)
    if match is None or (len(match[1]) == 1 and os.name == "nt"):  # C:\ is a drive
        _refuse_store_lookalike(url)
        return "file", url
    protocol, slashes, rest = match[1].lower(), match[2], match[3]
    if protocol in _LOCAL:
        return "file", "/" + rest.lstrip("/") if slashes else rest
    if slashes != "//":
        raise StorageError(
            f"checkpoint URL {url!r} is malformed: a URL starts with {protocol}:// (two "
            f"slashes); write {protocol}://{rest.lstrip('/') or 'BUCKET/PATH'}.",
            url=url,
            reason="bad-url",
        )
    if protocol in _BUCKETED and not rest.split("/", 1)[0]:
        raise StorageError(
            f"checkpoint URL {url!r} names no bucket: write {protocol}://BUCKET/PATH.",
            url=url,
            reason="bad-url",
        )
    return protocol, rest.rstrip("/")


def _refuse_store_lookalike(path: str) -> None:
    """Refuse a relative path that is an object store's URL with its colon left out
    (``s3//bucket/run``, ``gs/bucket/run``): as a path it would write ``./s3/bucket/run``
    in the working folder, silently. ``./s3/bucket/run`` says a local folder is meant.

    >>> _refuse_store_lookalike("s3-runs/a"); _refuse_store_lookalike("./s3/bucket")
    >>> try:
    ...     _refuse_store_lookalike("gs//bucket/run")
    ... except StorageError as exc:
    ...     print(str(exc).partition(": ")[2])
    it would write the local folder ./gs//bucket/run. Write gs://bucket/run for the bucket, or ./gs//bucket/run for a local folder.
    """
    slip = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)(/+)(.+)$", path)
    if slip is None or slip[1].lower() not in _STORES:
        return
    protocol, rest = slip[1].lower(), slip[3].lstrip("/")
    raise StorageError(
        f"checkpoint location {path!r} is a relative path that begins like a {protocol}:// "
        f"URL without its colon: it would write the local folder ./{path}. Write "
        f"{protocol}://{rest} for the bucket, or ./{path} for a local folder.",
        url=path,
        reason="bad-url",
    )


def is_remote_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` names object storage (any fsspec URL but ``file://``); a malformed
    URL raises :class:`StorageError` naming the fix.

    >>> is_remote_url("s3://bucket/run"), is_remote_url("file:///tmp/run"), is_remote_url("run")
    (True, False, False)
    """
    return split_url(os.fspath(location))[0] != "file"
