"""Crash-safe checkpoints in object storage, where there is no rename.

A checkpoint ``NAME`` under a :class:`~rankwise.storage.Storage` is three objects,
written in this order by :func:`publish`:

1. the data, ``NAME`` (a multipart upload for a large file: invisible until complete);
2. its manifest, ``NAME.sha256.json``: a local manifest's JSON (``files.new_manifest``:
   ``version``, ``file``, ``size``, ``xxh3_128``, ``created``, ``torch``, ``meta``), read and
   checked by the same code as on disk (``files.parse_manifest``, ``files.check_content``);
3. the pointer ``{prefix}-latest.json`` (``{"file": NAME, ...}``), as on disk.

A reader trusts a checkpoint only when its manifest exists (with a checkpoint key: carrying a
valid MAC over its content and the checkpoint's name) and the object's size and XXH3-128
match it (:func:`verify`). A writer killed after (1) leaves data with no manifest, after (2) a
good checkpoint the pointer does not name yet: :func:`latest` follows the pointer when its
target verifies and otherwise scans the checkpoints newest first, so it never returns a torn
one. Old checkpoints are pruned only after the new pointer is written; unfinished multipart
uploads are aborted by :func:`clean_partial_uploads`.

>>> from rankwise.storage import Storage
>>> store = Storage.for_url("memory://rankwise-doc/ckpts")
>>> for step in (1, 2, 3):
...     _ = publish(store, f"state {step}".encode(), f"ckpt-s{step:03d}.pt", keep_last=2)
>>> checkpoints(store), latest(store)
(['ckpt-s002.pt', 'ckpt-s003.pt'], 'ckpt-s003.pt')
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from rankwise.storage import Storage
from rankwise.storage.local import json_bytes
from rankwise.train.checkpoint.files import (
    CheckpointError,
    CheckpointWarning,
    check_content,
    checksum_of,
    fault_point,
    load_torch,
    manifest_path,
    new_checksum,
    new_manifest,
    parse_manifest,
    sign,
)

_CHUNK = 8 << 20


def manifest_key(name: str) -> str:
    """The manifest's name for checkpoint ``name`` (the local suffix).

    >>> manifest_key("ckpt-s001.pt")
    'ckpt-s001.pt.sha256.json'
    """
    return manifest_path(name).name


_MANIFEST_SUFFIX = manifest_key("x").removeprefix("x")


def pointer_key(prefix: str = "ckpt") -> str:
    """The pointer's name, as :class:`~rankwise.train.checkpoint.CheckpointManager`'s."""
    return f"{prefix}-latest.json"


def publish(
    storage: Storage,
    source: bytes | str | os.PathLike[str],
    name: str,
    *,
    prefix: str = "ckpt",
    pointer: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    manifest: dict[str, Any] | None = None,
    keep_last: int | None = None,
    key: str | bytes | None = None,
) -> dict[str, Any]:
    """Write checkpoint ``name`` from ``source`` (bytes, or a local file): data, then
    manifest, then the pointer (with ``pointer``'s extra fields, e.g. epoch and step), then
    prune to ``keep_last`` (``None`` keeps all). Returns the manifest. ``manifest``: the local
    file's own (``save_file`` computed it while writing), uploaded as it is; otherwise one is
    made here (with ``meta``). Each upload retries transient failures under ``storage.retry``;
    when one gives up, the pointer still names the previous checkpoint. The manifest is
    signed under ``key`` (default: ``RANKWISE_CHECKPOINT_KEY``; none: no MAC).

    Fault points (:func:`~rankwise.train.checkpoint.set_fault_hook`): ``mid-upload`` once the
    first part of a file's data is up (the whole object, for one part), ``before-pointer`` and
    ``before-prune``."""
    if name.endswith(_MANIFEST_SUFFIX) or name == pointer_key(prefix):
        raise ValueError(f"{name!r} is a manifest's or the pointer's name; rename it.")
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        manifest = manifest or new_manifest(
            name, len(data), xxhash.xxh3_128(data).hexdigest(), meta
        )
        storage.put(data, name)
        fault_point("mid-upload")
    else:
        # 0.03 s for 300 MB when not given: cheaper than re-reading the object
        manifest = manifest or new_manifest(name, *_digest_file(source), meta)
        first = [True]

        def uploaded(_: int) -> None:
            if first[0]:
                first[0] = False
                fault_point("mid-upload")

        if storage.put(source, name, uploaded=uploaded) != manifest["size"]:
            raise CheckpointError(f"{source} changed while it was uploaded to {name}.")
    manifest = sign({**manifest, "file": name}, name, key)
    storage.put(json_bytes(manifest), manifest_key(name))
    fault_point("before-pointer")
    storage.put(json_bytes({**(pointer or {}), "file": name}), pointer_key(prefix))
    fault_point("before-prune")
    if keep_last is not None:
        prune(storage, keep_last, prefix=prefix, saved=name)
    return manifest


def _digest_file(path: str | os.PathLike[str]) -> tuple[int, str]:
    return os.path.getsize(path), checksum_of(Path(path))


def checkpoints(storage: Storage, prefix: str = "ckpt") -> list[str]:
    """The checkpoint names under ``storage`` (``{prefix}-*`` but manifests and the
    pointer), valid or not, oldest first: names sort by age (zero-padded numbers)."""
    suffix, pointer = _MANIFEST_SUFFIX, pointer_key(prefix)
    return [
        n
        for n in storage.names()
        if n.startswith(f"{prefix}-") and not n.endswith(suffix) and n != pointer
    ]


def read_manifest(
    storage: Storage, name: str, key: str | bytes | None = None
) -> tuple[dict[str, Any], str]:
    """``(manifest, algorithm)`` of ``name``; :class:`CheckpointError` when it is missing,
    unreadable or not trusted (``files.check_trust`` under ``key``: a MAC missing or wrong, a
    name claiming another step)."""
    checkpoint_key, key = key, manifest_key(name)
    what = f"checkpoint {storage.url_of(name)}"
    try:
        raw = storage.read(key)
    except FileNotFoundError:
        raise CheckpointError(
            f"{what} has no manifest ({key}): its upload did not finish; it cannot be "
            "verified, so it is not used."
        ) from None
    return parse_manifest(raw, what, key, name=name, key=checkpoint_key)


def verify(storage: Storage, name: str, key: str | bytes | None = None) -> dict[str, Any]:
    """Check ``name`` against its manifest (trusted under ``key``, see :func:`read_manifest`;
    then size, then the checksum of its bytes, streamed); return the manifest or raise
    :class:`CheckpointError` saying what is wrong."""
    manifest, algorithm = read_manifest(storage, name, key)
    try:
        size = storage.size(name)
    except FileNotFoundError:
        raise CheckpointError(
            f"checkpoint {storage.url_of(name)} is missing; its manifest remains."
        ) from None

    def streamed() -> str:
        checksum = new_checksum(algorithm)
        with storage.open_read(name) as f:
            while chunk := f.read(_CHUNK):
                checksum.update(chunk)
        return str(checksum.hexdigest())

    what = f"checkpoint {storage.url_of(name)}"
    check_content(what, manifest["size"], manifest[algorithm], algorithm, size, streamed)
    return manifest


def fetch(
    storage: Storage, name: str, dest: str | os.PathLike[str], key: str | bytes | None = None
) -> Path:
    """Download ``name`` to the local file ``dest`` and verify it there (one read of the
    object; the manifest trusted under ``key``, see :func:`read_manifest`); raises
    :class:`CheckpointError` (and removes ``dest``) when it does not match."""
    manifest, algorithm = read_manifest(storage, name, key)
    path = storage.download(name, dest)
    try:
        check_content(
            f"checkpoint {storage.url_of(name)}",
            manifest["size"],
            manifest[algorithm],
            algorithm,
            path.stat().st_size,
            lambda: checksum_of(path, algorithm),
        )
    except CheckpointError:
        path.unlink(missing_ok=True)
        raise
    return path


def load(storage: Storage, name: str, key: str | bytes | None = None) -> dict[str, Any]:
    """Checkpoint ``name``'s state: downloaded to a temporary file, verified (under ``key``,
    see :func:`read_manifest`), loaded (``torch.load(weights_only=True)``); the file is gone
    when this returns."""
    with tempfile.TemporaryDirectory(prefix="rankwise-fetch-") as folder:
        path = fetch(storage, name, Path(folder) / name, key)
        return load_torch(path, f"checkpoint {storage.url_of(name)}", name=name)


def pointer_target(storage: Storage, prefix: str = "ckpt") -> str | None:
    """The name the pointer holds, or ``None`` (no pointer, or an unreadable one: warned)."""
    key = pointer_key(prefix)
    try:
        return str(json.loads(storage.read(key))["file"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        warnings.warn(
            f"checkpoint pointer {storage.url_of(key)} is unreadable ({e}); scanning for the "
            "newest valid checkpoint instead.",
            CheckpointWarning,
            stacklevel=3,
        )
        return None


def candidates(storage: Storage, prefix: str = "ckpt", names: list[str] | None = None) -> list[str]:
    """The checkpoints in the order a resume tries them: the pointer's target, then those
    older than it newest first, then newer ones (a save killed before its pointer moved).
    ``names``: the checkpoints to order (default: :func:`checkpoints`, the files)."""
    names = checkpoints(storage, prefix) if names is None else names
    target = pointer_target(storage, prefix)
    if target is None or target not in names:
        return names[::-1]
    older = [n for n in names if n < target]
    newer = [n for n in names if n > target]
    return [target, *older[::-1], *newer[::-1]]


def first_valid(
    storage: Storage, prefix: str, take: Callable[[str], Any], names: list[str] | None = None
) -> tuple[str, Any] | None:
    """``(name, take(name))`` for the first of :func:`candidates` (of ``names``) whose
    ``take`` does not raise :class:`CheckpointError`; each skipped one is named by a
    :class:`CheckpointWarning`."""
    for name in candidates(storage, prefix, names):
        try:
            return name, take(name)
        except CheckpointError as e:
            warnings.warn(
                f"{e} Skipping it and trying the previous checkpoint.",
                CheckpointWarning,
                stacklevel=3,
            )
    return None


def latest(storage: Storage, prefix: str = "ckpt") -> str | None:
    """The newest checkpoint that verifies (see :func:`candidates`), or ``None``."""
    found = first_valid(storage, prefix, lambda name: verify(storage, name))
    return None if found is None else found[0]


def prune(
    storage: Storage, keep_last: int, *, prefix: str = "ckpt", saved: str | None = None
) -> list[str]:
    """Delete all but the ``keep_last`` newest complete checkpoints up to ``saved`` (default:
    the pointer's target), and the incomplete ones (no manifest) older than it; return the
    deleted names. Newer ones are left alone: a save may be in flight. Call it only after the
    pointer names ``saved``. Each goes manifest first, so a kill in between leaves data no
    reader trusts, never a manifest vouching for missing data."""
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ValueError(f"keep_last ({keep_last!r}) must be an integer >= 1.")
    saved = saved or pointer_target(storage, prefix)
    if saved is None:
        return []
    names = set(storage.names())
    older = [n for n in checkpoints(storage, prefix) if n < saved]
    doomed = [n for n in older if manifest_key(n) not in names]
    complete = [n for n in older if n not in doomed]
    doomed += complete[: max(0, len(complete) - (keep_last - 1))]
    for name in doomed:
        storage.delete(manifest_key(name))
        storage.delete(name)
    return sorted(doomed)


def clean_partial_uploads(storage: Storage, *, older_than: float | None = None) -> list[str]:
    """Abort unfinished multipart uploads under ``storage`` (a writer killed mid-upload
    leaves one: never visible as an object, but stored and billed until aborted); return their
    keys. Call it at start, before this run's first save, or pass ``older_than`` (seconds)
    to spare uploads in flight."""
    return storage.abort_uploads(older_than=older_than)
