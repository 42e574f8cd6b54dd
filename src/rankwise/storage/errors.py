"""What a storage failure means and how it is told: :class:`StorageError` naming the URL, the
cause and the fix (never a credential), :class:`StorageWarning` for a retry, and
:func:`classify`, which sorts a backend's exception into what it means for the user."""

from __future__ import annotations

import re
from collections.abc import Iterable

from rankwise.distributed.errors import RankwiseWarning

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
    "PermissionDeniedError",  # obstore
    "UnauthenticatedError",
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

# obstore reports a timeout, a refused connection and a 5xx alike as a GenericError.
_OBSTORE_TRANSIENT = re.compile(
    r"error sending request|timed out|connection|status code: 5\d\d", re.IGNORECASE
)


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
        response = getattr(e, "response", None) or {}  # botocore's timeouts carry None
        code = str(response.get("Error", {}).get("Code", ""))
        name = type(e).__name__
        if code in _MISSING_BUCKET:
            return "missing-bucket"
        if code in _REFUSED or name in _REFUSED or isinstance(e, PermissionError):
            return "refused"
        if code in _TRANSIENT_CODES or name in _TRANSIENT_NAMES:
            return "unreachable"
        if isinstance(e, _TRANSIENT_TYPES):
            return "unreachable"
        if name == "GenericError" and _OBSTORE_TRANSIENT.search(str(e)):
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
