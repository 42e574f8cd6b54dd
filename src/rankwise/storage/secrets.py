"""Which storage options are credentials, and :func:`scrub`, which keeps them (and a URL's
``user:password@``) out of messages, logs and config dumps.

``checkpoint_storage_options`` (the fsspec keyword arguments of an object store) may hold a
key, a secret or a token. They are used to reach the store and nowhere else: the config's
dict, YAML file and checkpoint copy show ``"***"`` in their place, and every storage error is
scrubbed of them.

>>> redacted({"key": "AKIA123", "client_kwargs": {"region_name": "eu-west-1"}, "secret": "x1y2"})
{'key': '***', 'client_kwargs': {'region_name': 'eu-west-1'}, 'secret': '***'}
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

__all__ = ["REDACTED", "redacted", "scrub", "secret_values"]

REDACTED = "***"
# An option whose name says it holds a credential (s3fs: key, secret, token; adlfs:
# account_key, sas_token, client_secret; gcsfs: token; passwords of any backend).
_SECRET_NAME = re.compile(r"secret|token|password|passwd|key|credential|sas", re.IGNORECASE)


def _is_secret(name: Any, value: Any) -> bool:
    return isinstance(value, str) and bool(_SECRET_NAME.search(str(name)))


def secret_values(options: dict[str, Any]) -> list[str]:
    """The values in ``options`` (nested) that may be credentials, to scrub from messages
    (values shorter than 4 characters are left: replacing them would garble any text)."""
    found: list[str] = []
    for name, value in options.items():
        if isinstance(value, dict):
            found += secret_values(value)
        elif _is_secret(name, value) and len(value) >= 4:
            found.append(value)
    return found


def redacted(options: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``options`` (nested) with each credential's value replaced by ``"***"``."""
    return {
        name: redacted(value)
        if isinstance(value, dict)
        else REDACTED
        if _is_secret(name, value)
        else value
        for name, value in options.items()
    }


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with ``user:password@`` in URLs and each of ``secrets`` replaced by ``***``.

    >>> scrub("s3://me:pw@host/b failed for abcd1234", ["abcd1234"])
    's3://***@host/b failed for ***'
    """
    text = re.sub(r"(://)[^/@\s]*:[^/@\s]*@", r"\1***@", text)
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
