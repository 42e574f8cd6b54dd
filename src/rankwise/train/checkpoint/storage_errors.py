"""Failures of checkpoint storage: URLs checked up front, errors that name the URL and the
fix (never a credential), and bounded retries with exponential backoff for transient faults.

>>> split_url("s3:/bucket/run")
Traceback (most recent call last):
...
rankwise.train.checkpoint.storage_errors.StorageError: checkpoint URL 's3:/bucket/run' is malformed: a URL starts with s3:// (two slashes); write s3://bucket/run.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
import warnings
from collections.abc import Callable, Iterable
from typing import TypeVar

from rankwise.distributed.errors import RankwiseWarning

T = TypeVar("T")

_BUCKETED = {"s3", "s3a", "gs", "gcs", "az", "abfs"}  # a URL of these names a bucket first
_LOCAL = {"file", "local"}
# Object stores whose URL, with its colon (or a slash) left out, still reads as a relative path.
_STORES = _BUCKETED | {"abfss", "adl", "oci", "hf"}

# Codes (botocore ClientError) and exception class names, by what they mean for the user.
_MISSING_BUCKET = {"NoSuchBucket"}
_REFUSED = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AuthorizationHeaderMalformed",
    "NoCredentialsError",
    "PartialCredentialsError",
}
_TRANSIENT_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "500"}
_TRANSIENT_TYPES = (ConnectionError, TimeoutError)
_TRANSIENT_NAMES = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ClientConnectionError",  # aiohttp
    "ServerDisconnectedError",
    "ClientOSError",
    "FSTimeoutError",
}


class StorageError(RuntimeError):
    """Checkpoint storage failed; the message names the URL, the cause and the fix.

    ``reason`` is one of ``missing-backend``, ``bad-url``, ``missing-bucket``, ``refused``,
    ``unreachable``, ``failed``."""

    def __init__(self, message: str, *, url: str, reason: str) -> None:
        super().__init__(message)
        self.url = url
        self.reason = reason


class StorageWarning(RankwiseWarning):
    """A storage operation failed and is being retried (the message names the URL)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How often a transient failure is retried: ``attempts`` tries in all, waiting
    ``first_delay * 2**i`` seconds (at most ``max_delay``) after the ``i``-th failure.

    >>> RetryPolicy(attempts=4, first_delay=0.5, max_delay=1.0).delays()
    [0.5, 1.0, 1.0]
    """

    attempts: int = 5
    first_delay: float = 0.5
    max_delay: float = 8.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ValueError(f"attempts ({self.attempts!r}) must be an integer >= 1.")
        if self.attempts < 1:
            raise ValueError(f"attempts ({self.attempts}) must be >= 1 (1: no retry).")
        if not 0 <= self.first_delay <= self.max_delay:
            raise ValueError(
                f"first_delay ({self.first_delay}) and max_delay ({self.max_delay}) must "
                "satisfy 0 <= first_delay <= max_delay (seconds)."
            )

    def delays(self) -> list[float]:
        """The waits between the attempts, in order."""
        return [min(self.first_delay * 2**i, self.max_delay) for i in range(self.attempts - 1)]


def _causes(error: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def classify(error: BaseException) -> str:
    """What ``error`` (from fsspec or a backend) means: ``missing-bucket``, ``refused``,
    ``unreachable`` (transient: worth a retry), ``not-found`` or ``failed``."""
    for e in _causes(error):
        code = str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))
        name = type(e).__name__
        if code in _MISSING_BUCKET:
            return "missing-bucket"
        if code in _REFUSED or name in _REFUSED or isinstance(e, PermissionError):
            return "refused"
        if code in _TRANSIENT_CODES or name in _TRANSIENT_NAMES:
            return "unreachable"
        if isinstance(e, _TRANSIENT_TYPES):
            return "unreachable"
    return "not-found" if isinstance(error, FileNotFoundError) else "failed"


FIXES = {
    "missing-bucket": "the bucket does not exist: create it (`aws s3 mb s3://BUCKET`, or in "
    "Python `s3fs.S3FileSystem().mkdir('BUCKET')`) or correct the URL",
    "refused": "the store refused the credentials: check AWS_ACCESS_KEY_ID / "
    "AWS_SECRET_ACCESS_KEY (or the profile, or storage_options' key / secret) and that they may "
    "read, write, list and delete under this URL",
    "unreachable": "the store could not be reached: check the endpoint (AWS_ENDPOINT_URL or "
    "storage_options' endpoint_url), the network, and that the store is up",
    "failed": "see the cause above",
}


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


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with ``user:password@`` in URLs and each of ``secrets`` replaced by ``***``.

    >>> scrub("s3://me:pw@host/b failed for abcd1234", ["abcd1234"])
    's3://***@host/b failed for ***'
    """
    text = re.sub(r"(://)[^/@\s]*:[^/@\s]*@", r"\1***@", text)
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def retrying(
    op: Callable[[], T],
    *,
    what: str,
    url: str,
    policy: RetryPolicy,
    scrub: Callable[[str], str] = lambda text: text,
    sleep: Callable[[float], None] = time.sleep,
    announce: Callable[[str], None] | None = None,
) -> T:
    """``op()``, retried under ``policy`` while it fails transiently (see :func:`classify`),
    each retry announced by a :class:`StorageWarning` naming ``what`` (an operation and its
    URL), or by ``announce(message)`` when given (a storage that warns once per outage).
    Gives up with :class:`StorageError` naming ``what``, the cause and the fix; a missing
    object raises ``FileNotFoundError`` naming it, at once. ``scrub`` cleans every message."""
    delays = policy.delays()
    for attempt in range(policy.attempts):
        try:
            return op()
        except Exception as e:
            kind = classify(e)
            cause = scrub(f"{type(e).__name__}: {e}")
            if kind == "unreachable" and attempt < len(delays):
                message = (
                    f"{what} failed ({cause}); retrying in {delays[attempt]:.1f} s (attempt "
                    f"{attempt + 2} of {policy.attempts})."
                )
                if announce is not None:
                    announce(message)
                else:
                    warnings.warn(message, StorageWarning, stacklevel=4)
                sleep(delays[attempt])
                continue
            if kind == "not-found":
                raise FileNotFoundError(f"{what.split(' ')[-1]} does not exist.") from None
            tries = f" after {policy.attempts} attempts" if policy.attempts > 1 else ""
            # from None: the chained backend exceptions are not scrubbed
            raise StorageError(
                f"{what} failed{tries}: {cause.rstrip('.')}. Fix: {FIXES[kind]}.",
                url=url,
                reason=kind,
            ) from None
    raise AssertionError("unreachable")  # the last attempt returns or raises
