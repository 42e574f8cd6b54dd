"""Crash-safe checkpoints in object storage, where there is no rename.

A checkpoint ``NAME`` under a :class:`~rankwise.storage.Storage` is three objects,
written in this order by :func:`publish`:

1. the data, ``NAME`` (a multipart upload for a large file: invisible until complete);
2. its manifest, ``NAME.sha256.json``: a local manifest's JSON (``manifests.new_manifest``:
   ``version``, ``file``, ``size``, ``xxh3_128``, ``created``, ``torch``, ``meta``), read and
   checked by the same code as on disk (``manifests.parse_manifest``, ``manifests.check_content``);
3. the pointer ``{prefix}-latest.json`` (``{"file": NAME, ...}``), as on disk.

A reader trusts a checkpoint only when its manifest exists (with a checkpoint key: carrying a
valid MAC over its content and the checkpoint's name) and the object's size and XXH3-128
match it (:func:`verify`). A writer killed after (1) leaves data with no manifest, after (2) a
good checkpoint the pointer does not name yet: a resume (``catalogue.Catalogue``, the same
for folders and buckets) follows the pointer when its target verifies and otherwise scans the
checkpoints newest first, so it never takes a torn one. Old checkpoints are pruned only after the new pointer is written; unfinished multipart
uploads are aborted by :func:`clean_partial_uploads`.

>>> from rankwise.storage import Storage
>>> store = Storage.for_url("memory://rankwise-doc/ckpts")
>>> for step in (1, 2, 3):
...     name = f"ckpt-e000000-s{step:09d}.pt"
...     _ = publish(store, f"state {step}".encode(), name, catalogue=Catalogue(store, keep_last=2))
>>> catalogue = Catalogue(store)
>>> catalogue.names()
['ckpt-e000000-s000000002.pt', 'ckpt-e000000-s000000003.pt']
>>> catalogue.first_valid(lambda name: verify(store, name))[0]
'ckpt-e000000-s000000003.pt'
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import xxhash

from rankwise.storage import Storage
from rankwise.storage.local import json_bytes
from rankwise.train.checkpoint.catalogue import Catalogue, manifest_key
from rankwise.train.checkpoint.errors import CheckpointError
from rankwise.train.checkpoint.faults import fault_point
from rankwise.train.checkpoint.files import load_torch
from rankwise.train.checkpoint.manifests import (
    MANIFEST_SUFFIX,
    check_content,
    checksum_of,
    new_checksum,
    new_manifest,
    parse_manifest,
    sign,
)

_CHUNK = 8 << 20


def publish(
    storage: Storage,
    source: bytes | str | os.PathLike[str],
    name: str,
    *,
    catalogue: Catalogue | None = None,
    pointer: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    manifest: dict[str, Any] | None = None,
    key: str | bytes | None = None,
) -> dict[str, Any]:
    """Write checkpoint ``name`` from ``source`` (bytes, or a local file): data, then
    manifest, then the pointer (with ``pointer``'s extra fields, e.g. epoch and step), then
    prune: ``catalogue.commit`` (default: ``storage``'s catalogue of prefix ``ckpt``, keeping
    every complete checkpoint). Returns the manifest. ``manifest``: the local
    file's own (``save_file`` computed it while writing), uploaded as it is; otherwise one is
    made here (with ``meta``). Each upload retries transient failures under ``storage.retry``;
    when one gives up, the pointer still names the previous checkpoint. The manifest is
    signed under ``key`` (default: ``RANKWISE_CHECKPOINT_KEY``; none: no MAC).

    Fault points (:func:`~rankwise.train.checkpoint.set_fault_hook`): ``mid-upload`` once the
    first part of a file's data is up (the whole object, for one part), ``before-pointer`` and
    ``before-prune``."""
    catalogue = catalogue or Catalogue(storage)
    if name.endswith(MANIFEST_SUFFIX) or name == catalogue.pointer_key:
        raise ValueError(f"{name!r} is a manifest's or the pointer's name; rename it.")
    manifest = upload(storage, source, name, meta=meta, manifest=manifest, key=key)
    catalogue.commit(name, pointer or {})
    return manifest


def upload(
    storage: Storage,
    source: bytes | str | os.PathLike[str],
    name: str,
    *,
    meta: dict[str, Any] | None = None,
    manifest: dict[str, Any] | None = None,
    key: str | bytes | None = None,
) -> dict[str, Any]:
    """Make checkpoint ``name`` visible in the bucket from ``source`` (bytes, or a finished
    local file): its data, then its manifest (signed under ``key``), the bucket's one step
    that a folder does by a rename. Returns the manifest (see :func:`publish`)."""
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
    return manifest


def _digest_file(path: str | os.PathLike[str]) -> tuple[int, str]:
    return os.path.getsize(path), checksum_of(Path(path))


def read_manifest(
    storage: Storage, name: str, key: str | bytes | None = None
) -> tuple[dict[str, Any], str]:
    """``(manifest, algorithm)`` of ``name``; :class:`CheckpointError` when it is missing,
    unreadable or not trusted (``manifests.check_trust`` under ``key``: a MAC missing or wrong, a
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


def clean_partial_uploads(storage: Storage, *, older_than: float | None = None) -> list[str]:
    """Abort unfinished multipart uploads under ``storage`` (a writer killed mid-upload
    leaves one: never visible as an object, but stored and billed until aborted); return their
    keys. Call it at start, before this run's first save, or pass ``older_than`` (seconds)
    to spare uploads in flight."""
    return storage.abort_uploads(older_than=older_than)
