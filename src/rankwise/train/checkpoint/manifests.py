"""Checkpoint manifests: what a checkpoint's size and checksum are (XXH3-128 since manifest
version 2; version 1's SHA-256 still verifies), the checks of bytes against them, and trust:
the checkpoint key, the manifest's MAC, and the name against the position inside. One format
and one check for files and sharded folders, on disk and in object storage.

>>> manifest_path("run/ckpt-e000000-s000000001.pt").name
'ckpt-e000000-s000000001.pt.sha256.json'
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import xxhash

from rankwise.distributed.environment import CHECKPOINT_KEY, checkpoint_key
from rankwise.train.checkpoint.errors import CheckpointError

_MANIFEST_VERSION = 2


# The manifest key of each checksum a manifest may hold, newest first, and its hasher.
_CHECKSUMS: dict[str, Callable[[], Any]] = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}


# The suffix of version 1 (SHA-256) kept for XXH3-128 manifests: one name for both versions.
MANIFEST_SUFFIX = ".sha256.json"


_CHUNK = 8 << 20


def manifest_path(path: str | os.PathLike[str]) -> Path:
    """Where the manifest (size and checksum) of checkpoint ``path`` lives."""
    path = Path(path)
    return path.with_name(path.name + MANIFEST_SUFFIX)


# The fix every verification failure names: the previous good file is what a resume needs.
USE_ANOTHER = (
    "load an earlier checkpoint, or resume='auto' to take the newest valid one in checkpoint_dir"
)


# -- trust: the key, the manifest's MAC, the name against the position inside ---------------

KEY_VARIABLE = CHECKPOINT_KEY


MAC = "hmac_sha256"  # the manifest key of its MAC


_DOMAIN = b"rankwise checkpoint manifest\0"


# The position a manager's name claims: {prefix}-e{epoch}-s{step} with a file's or folder's suffix.
_POSITION = re.compile(r"-e(\d+)-s(\d+)(\.pt|\.dcp)$")


_NO_MAC_FIX = (
    "set the key it was written with (a checkpoint written before a key was set loads only "
    "with the key unset, unchecked as every unkeyed checkpoint), or " + USE_ANOTHER
)


def resolve_key(key: str | bytes | None = None) -> bytes | None:
    """The checkpoint key as bytes: ``key`` (the config's ``checkpoint_key``) when given, else
    the environment variable ``RANKWISE_CHECKPOINT_KEY``, else None (manifests carry no MAC and
    none is checked). An empty key is refused: it would sign with a secret everyone knows.

    >>> resolve_key("s3cret")
    b's3cret'
    """
    where = "checkpoint_key"
    if key is None:
        key, where = checkpoint_key(), KEY_VARIABLE
        if key is None:
            return None
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, bytes | bytearray) or not key:
        raise ValueError(
            f"{where} is empty or not a string: give a secret (e.g. the output of "
            f"'openssl rand -hex 32'), or leave {where} unset for unkeyed checkpoints."
        )
    return bytes(key)


def manifest_mac(manifest: dict[str, Any], name: str, key: str | bytes | None = None) -> str:
    """The HMAC-SHA256 (hex) of a manifest's content (all but its MAC) and the checkpoint's
    ``name``, under ``key`` (see :func:`resolve_key`): renaming the checkpoint or changing a
    byte of its manifest breaks it."""
    secret = resolve_key(key)
    if secret is None:
        raise ValueError(f"no checkpoint key: set checkpoint_key or {KEY_VARIABLE}.")
    body = {k: v for k, v in manifest.items() if k != MAC}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    message = _DOMAIN + name.encode() + b"\0" + canonical.encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign(manifest: dict[str, Any], name: str, key: str | bytes | None = None) -> dict[str, Any]:
    """``manifest`` with its MAC over its content and ``name`` when a key is set (see
    :func:`resolve_key`), without one otherwise."""
    body = {k: v for k, v in manifest.items() if k != MAC}
    secret = resolve_key(key)
    return body if secret is None else {**body, MAC: manifest_mac(body, name, secret)}


def check_trust(
    manifest: dict[str, Any], name: str, key: str | bytes | None, what: str, manifest_name: str
) -> None:
    """Raise :class:`CheckpointError` (naming ``what``) unless ``manifest`` vouches for
    checkpoint ``name``: with a key (see :func:`resolve_key`), a MAC over its content and
    ``name`` that matches; with or without one, the position ``name`` claims (``-e{epoch}-s
    {step}``) the same as the manifest's ``meta``."""
    secret = resolve_key(key)
    if secret is not None:
        mac = manifest.get(MAC)
        if not isinstance(mac, str):
            raise CheckpointError(
                f"{what}: its manifest {manifest_name} carries no MAC, and a checkpoint key is "
                f"set (checkpoint_key or {KEY_VARIABLE}): it was written without the key, or "
                f"its MAC was removed, so it is not trusted. Fix: {_NO_MAC_FIX}."
            )
        if not hmac.compare_digest(mac, manifest_mac(manifest, name, secret)):
            raise CheckpointError(
                f"{what}: its manifest {manifest_name}'s MAC does not match (written under "
                "another key, renamed, or its manifest changed after it was written), so it "
                f"is not trusted. Fix: set the key it was written with, or {USE_ANOTHER}."
            )
    check_position(name, manifest.get("meta"), what, f"its manifest {manifest_name}")


def check_position(name: str, held: Any, what: str, where: str) -> None:
    """Raise :class:`CheckpointError` when ``name`` claims an epoch and step
    (``...-e000001-s000000300.pt``) that ``held`` (a manifest's meta, or the state inside:
    a dict with int ``epoch``/``step``) contradicts. Other names claim nothing."""
    match = _POSITION.search(name)
    if match is None or not isinstance(held, dict):
        return
    named = {"epoch": int(match[1]), "step": int(match[2])}
    inside = {k: v for k in named if isinstance(v := held.get(k), int) and not isinstance(v, bool)}
    if all(inside[k] == named[k] for k in inside):
        return
    epoch, step = inside.get("epoch", named["epoch"]), inside.get("step", named["step"])
    own = f"{name[: match.start()]}-e{epoch:06d}-s{step:09d}{match[3]}"
    raise CheckpointError(
        f"{what} is named for epoch {named['epoch']} step {named['step']}, but {where} says "
        f"epoch {epoch} step {step}: it was renamed (or copied under another checkpoint's "
        "name), and a resume from it would go on from the wrong place, so it is not used. "
        f"Fix: give it back its own name ({own}, with its manifest), or {USE_ANOTHER}."
    )


def new_manifest(name: str, size: int, digest: str, meta: dict[str, Any] | None) -> dict[str, Any]:
    """The manifest of checkpoint ``name`` (``size`` bytes of XXH3-128 ``digest``): the one
    format a local file and an object in a bucket both carry."""
    return {
        "version": _MANIFEST_VERSION,
        "file": name,
        "size": size,
        "xxh3_128": digest,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "meta": meta or {},
    }


def parse_manifest(
    raw: bytes | str, what: str, manifest_name: str, *, name: str, key: str | bytes | None
) -> tuple[dict[str, Any], str]:
    """``(manifest, algorithm)`` of the manifest of checkpoint ``name`` from its bytes
    (``algorithm``: the checksum it holds); :class:`CheckpointError` naming ``what`` when it is
    unreadable, from a newer rankwise, or not trusted (:func:`check_trust` under ``key``)."""
    try:
        manifest = json.loads(raw)
        algorithm = next(name for name in _CHECKSUMS if name in manifest)
        manifest["size"], manifest[algorithm] = int(manifest["size"]), str(manifest[algorithm])
    except StopIteration:
        raise CheckpointError(
            f"{what}: its manifest {manifest_name} holds no checksum this rankwise "
            f"knows ({sorted(_CHECKSUMS)}); it was written by a newer rankwise: load it "
            "there."
        ) from None
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{what}: its manifest {manifest_name} is unreadable ({e}).") from e
    check_trust(manifest, name, key, what, manifest_name)
    return dict(manifest), algorithm


def new_checksum(algorithm: str = "xxh3_128") -> Any:
    """A fresh hasher for ``algorithm`` (a checksum key of the manifests)."""
    return _CHECKSUMS[algorithm]()


def checksum_of(path: Path, algorithm: str = "xxh3_128") -> str:
    """The checksum of ``path``'s bytes under ``algorithm`` (a key of the manifests)."""
    checksum = new_checksum(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            checksum.update(chunk)
    return str(checksum.hexdigest())


def check_bytes(path: Path, size: int, digest: str, algorithm: str, what: str) -> None:
    """Raise :class:`CheckpointError` (naming ``what``) when ``path`` is not ``size`` bytes
    whose ``algorithm`` checksum is ``digest``."""
    check_content(
        what, size, digest, algorithm, path.stat().st_size, lambda: checksum_of(path, algorithm)
    )


def check_content(
    what: str,
    size: int,
    digest: str,
    algorithm: str,
    actual_size: int,
    actual_digest: Callable[[], str],
) -> None:
    """The one check of bytes against a manifest, local or in a bucket: raise
    :class:`CheckpointError` (naming ``what``) unless ``actual_size`` is ``size`` and then
    ``actual_digest()`` (only computed when the sizes match) is ``digest``."""
    if actual_size != size:
        kind = "truncated (torn write)" if actual_size < size else "longer than written"
        raise CheckpointError(
            f"{what} is {kind}: {actual_size} bytes, expected {size}; it is not used: "
            f"{USE_ANOTHER}."
        )
    found = actual_digest()
    if found != digest:
        raise CheckpointError(
            f"{what} is corrupt: {algorithm} {found[:16]}... does not match the manifest's "
            f"{digest[:16]}... (bytes changed after it was written); it is not used: "
            f"{USE_ANOTHER}."
        )
