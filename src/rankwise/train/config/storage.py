"""The rules of the checkpoint store's fields: ``checkpoint_storage_options`` (what fsspec and
s3fs take) and ``checkpoint_key`` (the secret that signs manifests, never shown)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rankwise.storage import REDACTED
from rankwise.train.config.plain import check_yaml_values, refuse_redacted
from rankwise.train.config.rules import fail


def storage_values(item: Any, where: str) -> None:
    """Refuse a list anywhere in storage options (fsspec's and s3fs's options take strings,
    numbers, booleans, None and dicts of those), naming the key."""
    if isinstance(item, Mapping):
        for key, inner in item.items():
            storage_values(inner, f"{where}[{key!r}]")
    elif isinstance(item, list | tuple):
        fail(
            "checkpoint_storage_options",
            where,
            f"holds a {type(item).__name__}; the object store's options are strings, numbers, "
            "booleans, None or nested dicts of those (fsspec/s3fs take no lists): give this "
            "key one value",
        )


def check_storage_options(value: Any) -> dict[str, Any] | None:
    """``checkpoint_storage_options`` as a plain dict (string keys; strings, numbers, booleans,
    None and nested dicts of those: what fsspec and s3fs take), or None.

    >>> check_storage_options({"endpoint_url": "http://127.0.0.1:8333"})
    {'endpoint_url': 'http://127.0.0.1:8333'}
    """
    name = "checkpoint_storage_options"
    if value is None:
        return None
    if not isinstance(value, Mapping):
        fail(
            name,
            type(value).__name__,
            "must be a dict of the object store's fsspec options, e.g. "
            "{'endpoint_url': 'https://s3.example.com'}, or None (the AWS_* variables and the "
            "provider's own files)",
        )
    check_yaml_values(name, value, "options")
    storage_values(value, "options")
    options = dict(value)
    refuse_redacted(name, options, "the AWS_* variables or the provider's own files")
    return options


def check_checkpoint_key(value: Any) -> None:
    """Refuse a ``checkpoint_key`` that is not None or a non-empty string (the message never
    shows the value: it is a secret).

    >>> check_checkpoint_key("a-long-random-secret")
    """
    fix = (
        "give the secret as a string (e.g. the output of 'openssl rand -hex 32'), or None to "
        "take RANKWISE_CHECKPOINT_KEY from the environment (unset: unkeyed checkpoints)"
    )
    if value is None:
        return
    if not isinstance(value, str) or not value:
        what = "an empty string" if value == "" else f"a {type(value).__name__}"
        raise ValueError(f"DistributedTrainingConfig.checkpoint_key (not shown) is {what}: {fix}.")
    if value == REDACTED:
        raise ValueError(
            f"DistributedTrainingConfig.checkpoint_key holds {REDACTED!r}, the key redacted from "
            f"a saved config: {fix}."
        )
