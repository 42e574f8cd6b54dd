"""Tamper with a checkpoint on purpose, as an attacker with write access to its folder or
bucket would: for tests and the fault sweep of what a load must refuse.

:func:`tamper_checkpoint` applies one of :data:`TAMPERS` to a checkpoint, a file (``.pt`` and
its manifest) or a sharded DCP folder (``.dcp``), on disk or in object storage (a URL), and
returns where the tampered checkpoint now is (a new name after ``"rename-step"``). A
``"payload*"`` tamper plants a pickle that creates the file ``marker`` if it is ever unpickled:
a load that runs code from a checkpoint leaves that file behind.

What each tamper does (``file``: a ``.pt`` checkpoint; ``dcp``: a sharded folder):

- ``drop-entry``: the manifest no longer vouches for the data (file: manifest deleted; dcp:
  ``.metadata``'s entry removed from ``manifest.json``).
- ``unlisted-file`` (dcp only): a file the manifest does not list, added to the folder.
- ``flip-byte``: one byte of the data changed (file: the ``.pt``; dcp: a shard), manifest kept.
- ``rehash``: one byte changed and its manifest entry rewritten to match (size and checksum).
- ``payload``: the data (file: the ``.pt``; dcp: ``.metadata``) replaced by a code-running
  pickle; manifest kept.
- ``payload-unlisted``: the payload, and its manifest entry removed (file: manifest deleted).
- ``payload-rehashed``: the payload, and its manifest entry rewritten to match.
- ``rename-step``: the checkpoint (and its manifest) renamed to a step 5 later.
- ``strip-mac``: the manifest's MAC removed.
- ``forge-mac``: the manifest signed again, with a key that is not the run's.

Without a checkpoint key, ``rehash``, ``strip-mac`` and ``forge-mac`` cannot be told from an
honest checkpoint, and neither can a sharded folder's ``payload-rehashed`` (it runs the
payload): see "Checkpoint trust" in docs/train.md.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankwise.train.checkpoint import Storage

__all__ = ["DCP_ONLY", "TAMPERS", "tamper_checkpoint"]

TAMPERS = (
    "drop-entry",
    "unlisted-file",
    "flip-byte",
    "rehash",
    "payload",
    "payload-unlisted",
    "payload-rehashed",
    "rename-step",
    "strip-mac",
    "forge-mac",
)
DCP_ONLY = frozenset({"unlisted-file"})  # a file checkpoint has no folder to add a file to
_FOLDER_MANIFEST = "manifest.json"
_FILE_MANIFEST = ".sha256.json"
_METADATA = ".metadata"
_MAC = "hmac_sha256"
_STEP = re.compile(r"-s(\d+)(\.pt|\.dcp)$")


class _Payload:
    """Unpickled, it creates ``marker`` (through ``exec``): the proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').close()",))


class _Place:
    """The folder (local or a URL) holding a checkpoint: bytes by relative name."""

    def __init__(self, parent: str, storage_options: dict[str, Any] | None, storage: Any) -> None:
        from rankwise.train.checkpoint import Storage

        self.storage = storage or Storage.for_url(parent, storage_options)
        self.local = None if self.storage.is_remote else self.storage.local_path

    def read(self, name: str) -> bytes:
        if self.local is not None:
            return (self.local / name).read_bytes()
        return self.storage.read(name)

    def write(self, name: str, data: bytes) -> None:
        if self.local is not None:
            (self.local / name).parent.mkdir(parents=True, exist_ok=True)
            (self.local / name).write_bytes(data)
        else:
            self.storage.put(data, name)

    def delete(self, name: str) -> None:
        if self.local is not None:
            (self.local / name).unlink(missing_ok=True)
        else:
            self.storage.delete(name)

    def files(self, folder: str) -> list[str]:
        if self.local is not None:
            root = self.local / folder
            return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        return self.storage.child(folder).names()

    def remove_folder(self, folder: str) -> None:
        if self.local is not None:
            (self.local / folder).rmdir()
        else:
            self.storage.delete(folder)


def tamper_checkpoint(
    location: str | os.PathLike[str],
    how: str,
    *,
    marker: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    storage: Storage | None = None,
) -> str:
    """Tamper with the checkpoint at ``location`` (a ``.pt`` file or ``.dcp`` folder, a local
    path or an object-storage URL reached with ``storage_options``) as ``how`` (one of
    :data:`TAMPERS`; see the module); return the tampered checkpoint's location. ``marker``:
    the file a ``payload*`` tamper's pickle creates when unpickled (required for those).
    ``storage``: the :class:`~rankwise.train.checkpoint.Storage` of the folder holding the
    checkpoint, if there is one at hand (connecting anew costs about half a second)."""
    if how not in TAMPERS:
        raise ValueError(f"how ({how!r}) is not a tamper; use one of {TAMPERS}.")
    text = os.fspath(location).rstrip("/")
    parent, _, name = text.rpartition("/")
    sharded = name.endswith(".dcp")
    if not sharded and how in DCP_ONLY:
        raise ValueError(f"{how!r} applies to sharded (.dcp) checkpoints only; {text} is a file.")
    if how.startswith("payload") and marker is None:
        raise ValueError(f"{how!r} plants a pickle payload: pass marker, the file it creates.")
    place = _Place(parent or ".", storage_options, storage)
    if how == "rename-step":
        return _rename(place, parent, name, sharded)
    manifest_name = f"{name}/{_FOLDER_MANIFEST}" if sharded else name + _FILE_MANIFEST
    manifest = json.loads(place.read(manifest_name))
    entries = manifest["files"] if sharded else {name: manifest}
    target = _METADATA if sharded else name
    if how in ("flip-byte", "rehash") and sharded:
        target = next(n for n in entries if n.endswith(".distcp"))
    path = f"{name}/{target}" if sharded else name
    if how == "unlisted-file":
        place.write(f"{name}/__9_0.distcp", b"not listed in the manifest")
        return text
    if how in ("flip-byte", "rehash"):
        flipped = bytearray(place.read(path))
        flipped[len(flipped) // 2] ^= 0xFF
        place.write(path, bytes(flipped))
        if how == "rehash":
            _rehash(entries[target], bytes(flipped))
    elif how.startswith("payload"):
        payload = pickle.dumps(_Payload(os.fspath(marker)))  # type: ignore[arg-type]
        place.write(path, payload)
        if how == "payload-rehashed":
            _rehash(entries[target], payload)
    if how in ("drop-entry", "payload-unlisted"):
        if not sharded:
            place.delete(manifest_name)
            return text
        del entries[_METADATA]
    elif how == "strip-mac":
        manifest.pop(_MAC, None)
    elif how == "forge-mac":
        from rankwise.train.checkpoint.manifests import sign

        manifest = sign(manifest, name, "not-the-run-s-key")
    elif how == "flip-byte" or how == "payload":
        return text  # the manifest as it was
    place.write(manifest_name, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    return text


def _rehash(entry: dict[str, Any], data: bytes) -> None:
    import xxhash

    entry.pop("sha256", None)  # a version-1 manifest's: replaced by the current checksum
    entry["size"], entry["xxh3_128"] = len(data), xxhash.xxh3_128_hexdigest(data)


def _rename(place: _Place, parent: str, name: str, sharded: bool) -> str:
    match = _STEP.search(name)
    if match is None:
        raise ValueError(f"{name} is not named ...-s<step>.pt/.dcp; nothing to rename.")
    new = f"{name[: match.start()]}-s{int(match[1]) + 5:09d}{match[2]}"
    if sharded:
        for file in place.files(name):
            place.write(f"{new}/{file}", place.read(f"{name}/{file}"))
            place.delete(f"{name}/{file}")
        place.remove_folder(name)
    else:
        for suffix in ("", _FILE_MANIFEST):
            place.write(new + suffix, place.read(name + suffix))
            place.delete(name + suffix)
    return f"{parent}/{new}" if parent else new
