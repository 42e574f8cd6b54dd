"""The steps of a checkpoint save and load that differ by where checkpoints live, behind one
interface for :class:`~rankwise.train.checkpoint.CheckpointManager`: everything else (names,
pointer, candidates, pruning: ``catalogue.py``; the background writer: ``staging.py``; the
sharded writer: ``sharded.ShardedWriter``; the manifest format and its checks:
``manifests.py``) is written once above it.

The one step that truly differs is making a finished local file or folder visible under a
key: a rename on disk, an upload to a bucket.

- :class:`FolderSaves`: a local folder. A file is written in place by ``save_file``
  (temporary name, fsync, rename: it is visible once complete); a sharded save's ranks write
  into one shared temporary folder that rank 0 renames into place.
- :class:`BucketSaves`: object storage, which has no rename. A checkpoint ``NAME`` is three
  objects, written in this order: the data, ``NAME`` (written to a local temporary file
  exactly as on disk, then uploaded: a multipart upload for a large file, invisible until
  complete); its manifest ``NAME.sha256.json``, the local manifest's JSON; then the catalogue's
  pointer. A sharded save's ranks each upload their own files from a local folder, then rank 0
  ``train_state.pt`` and the manifest. A reader trusts a checkpoint only when its manifest
  exists (with a checkpoint key: carrying a valid MAC) and the object's size and XXH3-128 match
  it; a writer killed mid-way leaves data no reader trusts, or a good checkpoint the pointer
  does not name yet (the catalogue's scan finds it).

Both answer ``location``, ``write_file``, ``start_sharded``, ``verify``, ``load``, ``probe``,
``start`` and ``may_stall``, and the :class:`~rankwise.train.checkpoint.sharded.ShardTarget`
steps of sharded saves; a ``name`` is a checkpoint's name in the catalogue.

>>> from rankwise.storage import Storage
>>> store = Storage.for_url("memory://rankwise-doc/ckpts")
>>> saves = BucketSaves(Catalogue(store, keep_last=2), None)
>>> for step in (1, 2, 3):
...     name = f"ckpt-e000000-s{step:09d}.pt"
...     saves.write_file({"step": step}, name, {"epoch": 0, "step": step})
...     saves.catalogue.commit(name, {"epoch": 0, "step": step})
>>> saves.catalogue.names()
['ckpt-e000000-s000000002.pt', 'ckpt-e000000-s000000003.pt']
>>> saves.catalogue.first_valid(saves.load)
('ckpt-e000000-s000000003.pt', {'step': 3})
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rankwise.distributed as rd
from rankwise.storage import Storage, StorageError
from rankwise.storage.local import TMP_MARK, fsync_dir, json_bytes, remove_tree, tmp_name
from rankwise.train.checkpoint import sharded
from rankwise.train.checkpoint.catalogue import Catalogue, manifest_key
from rankwise.train.checkpoint.errors import CheckpointError
from rankwise.train.checkpoint.faults import fault_point
from rankwise.train.checkpoint.files import (
    load_file,
    load_torch,
    save_file,
    verify_file,
    write_json_atomic,
)
from rankwise.train.checkpoint.manifests import (
    check_content,
    checksum_of,
    manifest_path,
    new_checksum,
    parse_manifest,
)
from rankwise.train.checkpoint.portable import in_group
from rankwise.train.checkpoint.sharded import MANIFEST, ShardedWriter

__all__ = ["BucketSaves", "FolderSaves", "fetch_folder", "load_object", "verify_object"]

_CHUNK = 8 << 20


class FolderSaves:
    """A local folder's saves and loads (see the module)."""

    may_stall = False  # a local write ends: a save waits for the one before it

    def __init__(self, catalogue: Catalogue, key: bytes | None) -> None:
        self.catalogue = catalogue
        self.directory = catalogue.storage.local_path
        self.key = key  # the checkpoint key manifests are signed with (manifests.resolve_key)
        self._dcp = ShardedWriter(self, catalogue.commit, key)

    def location(self, name: str) -> Path:
        return self.directory / name

    def listed(self, name: str) -> Path:
        return self.directory / name

    def write_file(self, state: dict[str, Any], name: str, meta: dict[str, Any]) -> None:
        """``state`` as checkpoint file ``name`` and its manifest, fsynced and renamed."""
        self._remove_orphan_tmp_files()
        save_file(state, self.directory / name, meta=meta, key=self.key)

    def start_sharded(
        self, state: dict[str, Any], name: str, meta: dict[str, Any], *, background: bool
    ) -> Callable[[], Any]:
        """Start every rank's DCP write of ``state`` (see ``sharded.ShardedWriter``)."""
        return self._dcp.start(state, name, meta, background=background)

    # The steps of a sharded save (sharded.ShardTarget): one folder every rank writes into.
    def scratch(self, name: str) -> Path:
        """A fresh temporary folder beside the checkpoint, named by rank 0 and known to every
        rank (a collective)."""
        tmp: Path | None = None
        if rd.is_master():
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = tmp_name(self.directory / name)
            tmp.mkdir()
        if in_group():
            tmp = Path(rd.broadcast_plain(None if tmp is None else str(tmp)))
        assert tmp is not None  # rank 0 made it; the others received it
        return tmp

    def share(self, tmp: Path, name: str) -> dict[str, dict[str, Any]]:
        """Every rank's files are in the shared folder already: rank 0 lists and hashes them."""
        return sharded.file_entries(tmp) if rd.is_master() else {}

    def share_file(self, tmp: Path, name: str, file: str) -> None:
        """Written into the shared folder: visible with it."""

    def seal(self, tmp: Path, name: str, manifest: dict[str, Any]) -> None:
        """The manifest into the folder (last), then the folder renamed into place and its
        parent fsynced."""
        self._remove_orphan_tmp_files()
        write_json_atomic(tmp / MANIFEST, manifest)
        fault_point("before-rename")
        final = self.directory / name
        if final.exists():  # the same step saved again: the old folder goes first (a kill in
            remove_tree(final)  # between leaves neither, and the previous checkpoint is used)
        os.replace(tmp, final)
        fsync_dir(self.directory)

    def release(self, tmp: Path) -> None:
        """Renamed into place, or left for the next save to remove once this process is gone."""

    def verify(self, name: str) -> None:
        path = self.directory / name
        if sharded.is_sharded_path(path):
            sharded.verify_folder(path, key=self.key)
        else:
            verify_file(path, key=self.key)

    def load(self, name: str, *, shards: bool = True) -> dict[str, Any]:
        """Checkpoint ``name``'s verified state; ``shards=False``: a sharded folder's shards
        are checked by size only (a rank loading what rank 0 verified in full)."""
        path = self.directory / name
        if sharded.is_sharded_path(path):
            return sharded.read_state(path, verify_shards=shards, key=self.key)
        return load_file(path, key=self.key)

    def probe(self) -> str | None:
        """Whether a save can write here: create the folder, then create, fsync and delete a
        small file in it. None if it can, else what failed (the path and the OS error)."""
        probe = self.directory / f".{self.catalogue.prefix}-probe-{os.getpid()}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(probe, "wb") as f:
                f.write(b"rankwise")
                f.flush()
                os.fsync(f.fileno())
            probe.unlink()
        except OSError as exc:
            return f"the checkpoint folder {self.directory} is not writable ({probe}: {exc})"
        return None

    def start(self) -> list[str]:
        """Nothing to clean before the first save (a killed save's temporary files go at the
        next save, once their process is gone)."""
        return []

    def _remove_orphan_tmp_files(self) -> None:
        # Left by saves killed mid-write; a live writer's files (its pid runs) are left alone.
        if not self.directory.is_dir() or os.name == "nt":  # os.kill(pid, 0) kills on Windows
            return
        for path in self.directory.glob(f".{self.catalogue.prefix}-*{TMP_MARK}*"):
            pid = path.name.rsplit(TMP_MARK, 1)[1].split("-", 1)[0]
            if pid.isdigit() and not _pid_running(int(pid)):
                if path.is_dir():  # a sharded save's folder
                    shutil.rmtree(path, ignore_errors=True)
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    path.unlink()


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BucketSaves:
    """Object storage's saves and loads (see the module). Staging a file locally rather than
    streaming ``torch.save`` into the upload: the write to local disk is quick next to the
    upload, the checksum is known before the first byte goes up, and a failed upload is
    retried from the file without touching the training state again. Each upload retries
    transient failures under ``storage.retry``; when one gives up, the pointer still names the
    previous checkpoint."""

    may_stall = True  # a store may go silent: a background save queues behind the one running

    def __init__(self, catalogue: Catalogue, key: bytes | None) -> None:
        self.catalogue = catalogue
        self.storage: Storage = catalogue.storage
        self.key = key
        self._dcp = ShardedWriter(self, catalogue.commit, key)

    def location(self, name: str) -> str:
        return self.storage.url_of(name)

    def listed(self, name: str) -> str:
        return name

    def write_file(self, state: dict[str, Any], name: str, meta: dict[str, Any]) -> None:
        """``state`` written to a local temporary file (``save_file``: the manifest's checksum
        computed while writing), then uploaded (multipart, parts in parallel), then its
        manifest. Fault point ``mid-upload``: once the first part of the data is up (the whole
        object, for one part)."""
        with tempfile.TemporaryDirectory(prefix="rankwise-upload-") as folder:
            local = save_file(state, Path(folder) / name, meta=meta, key=self.key)
            manifest = json.loads(manifest_path(local).read_text())
            if _upload(self.storage, local, name) != manifest["size"]:
                raise CheckpointError(f"{local} changed while it was uploaded to {name}.")
            self.storage.put(json_bytes(manifest), manifest_key(name))

    def start_sharded(
        self, state: dict[str, Any], name: str, meta: dict[str, Any], *, background: bool
    ) -> Callable[[], Any]:
        """Start every rank's DCP write of ``state`` (see ``sharded.ShardedWriter``)."""
        return self._dcp.start(state, name, meta, background=background)

    # The steps of a sharded save (sharded.ShardTarget): a local folder per rank, uploaded.
    # Not torch's FsspecWriter streaming into the bucket: uploading finished local files gives
    # the checksums before the first byte goes up, retries a failed upload from the file, keeps
    # every call to the store in the one layer that retries and names the URL, and leaves no
    # upload that the manager's start does not abort.
    def scratch(self, name: str) -> Path:
        """A local temporary folder of this rank's own."""
        return Path(tempfile.mkdtemp(prefix="rankwise-dcp-"))

    def share(self, tmp: Path, name: str) -> dict[str, dict[str, Any]]:
        """Hash and upload every file this rank wrote; return their manifest entries."""
        files = sharded.file_entries(tmp)
        folder = self.storage.child(name)
        for file in files:
            _upload(folder, tmp / file, file)
        return files

    def share_file(self, tmp: Path, name: str, file: str) -> None:
        self.storage.child(name).put(tmp / file, file)

    def seal(self, tmp: Path, name: str, manifest: dict[str, Any]) -> None:
        self.storage.child(name).put(json_bytes(manifest), MANIFEST)

    def release(self, tmp: Path) -> None:
        shutil.rmtree(tmp, ignore_errors=True)

    def verify(self, name: str) -> Any:
        if name.endswith(sharded.SUFFIX):
            state = _found(fetch_folder, self.storage, name, self.key)
            shutil.rmtree(state["dcp"]["folder"], ignore_errors=True)
            return state
        return verify_object(self.storage, name, self.key)

    def load(self, name: str, *, shards: bool = True) -> dict[str, Any]:
        """The state of checkpoint ``name``, downloaded and verified once, in full (a sharded
        folder's state names its local copy, which loading it deletes)."""
        if name.endswith(sharded.SUFFIX):
            return _found(fetch_folder, self.storage, name, self.key)
        return load_object(self.storage, name, self.key)

    def probe(self) -> str | None:
        """None if a save can write here, else what failed, naming the URL (never a secret)."""
        try:
            self.storage.check_writable()
        except StorageError as exc:
            return str(exc).rstrip(".")
        return None

    def start(self) -> list[str]:
        """Fail now, naming the URL and the fix, when the store cannot be written; then abort
        the unfinished multipart uploads under the URL (a writer killed mid-upload leaves
        one: never visible as an object, but stored and billed until aborted); return their
        keys."""
        self.storage.check_writable()
        return self.storage.abort_uploads()


def _upload(storage: Storage, local: Path, key: str) -> int:
    """Upload the finished local file ``local`` to ``key``; fault point ``mid-upload`` once
    its first part is up (the whole object, for one part)."""
    first = [True]

    def uploaded(_: int) -> None:
        if first[0]:
            first[0] = False
            fault_point("mid-upload")

    return storage.put(local, key, uploaded=uploaded)


def _found(
    take: Callable[[Storage, str, bytes | None], dict[str, Any]],
    storage: Storage,
    name: str,
    key: bytes | None,
) -> Any:
    """``take(storage, name, key)``; a folder listed but empty (a store that keeps the name of
    a pruned folder) is a checkpoint that is not there: skipped."""
    try:
        return take(storage, name, key)
    except FileNotFoundError as e:
        raise CheckpointError(str(e)) from None


def _read_manifest(
    storage: Storage, name: str, key: str | bytes | None = None
) -> tuple[dict[str, Any], str]:
    """``(manifest, algorithm)`` of object ``name``; :class:`CheckpointError` when it is
    missing, unreadable or not trusted (``manifests.check_trust`` under ``key``: a MAC missing
    or wrong, a name claiming another step)."""
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


def verify_object(storage: Storage, name: str, key: str | bytes | None = None) -> dict[str, Any]:
    """Check object ``name`` against its manifest (trusted under ``key``; then size, then the
    checksum of its bytes, streamed); return the manifest or raise :class:`CheckpointError`
    saying what is wrong."""
    manifest, algorithm = _read_manifest(storage, name, key)
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


def load_object(storage: Storage, name: str, key: str | bytes | None = None) -> dict[str, Any]:
    """Checkpoint file ``name``'s state: downloaded to a temporary file, verified there (one
    read of the object; the manifest trusted under ``key``), loaded
    (``torch.load(weights_only=True)``); the file is gone when this returns."""
    manifest, algorithm = _read_manifest(storage, name, key)
    with tempfile.TemporaryDirectory(prefix="rankwise-fetch-") as folder:
        path = storage.download(name, Path(folder) / name)
        check_content(
            f"checkpoint {storage.url_of(name)}",
            manifest["size"],
            manifest[algorithm],
            algorithm,
            path.stat().st_size,
            lambda: checksum_of(path, algorithm),
        )
        return load_torch(path, f"checkpoint {storage.url_of(name)}", name=name)


def fetch_folder(storage: Storage, name: str, key: str | bytes | None = None) -> dict[str, Any]:
    """Sharded folder ``name`` downloaded to a local temporary folder and verified there with
    the local folder's own code (``sharded.read_state``, messages naming the URL): its plain
    state, whose ``"dcp"`` entry names the local copy that ``load_shards`` reads and then
    deletes. The manifest must list every object in the folder (only listed ones are
    downloaded) and, with a checkpoint ``key``, carry a MAC over its content and ``name``.
    Every rank downloads the whole folder (the shards a rank needs may come from any saved
    rank's files), so each needs room for one checkpoint in ``TMPDIR`` while it loads."""
    url = storage.url_of(name)
    folder = storage.child(name)
    present = set(folder.names())
    if not present:
        raise FileNotFoundError(f"checkpoint {url} does not exist.")
    local = Path(tempfile.mkdtemp(prefix="rankwise-fetch-"))
    atexit.register(shutil.rmtree, local, True)  # a copy never loaded goes at exit
    try:
        if MANIFEST in present:
            folder.download(MANIFEST, local / MANIFEST)
            for file in _listed(local / MANIFEST) & present:  # plain names: never a path
                folder.download(file, local / file)
        # a missing manifest or file, an unlisted object, a wrong MAC or name: named
        state = sharded.read_state(local, source=url, name=name, key=key, present=present)
    except BaseException:
        shutil.rmtree(local, ignore_errors=True)
        raise
    state["dcp"]["downloaded"] = True
    return state


def _listed(manifest: Path) -> set[str]:
    """The names a manifest lists (none when it is unreadable: the check then says so)."""
    try:
        return {str(name) for name in json.loads(manifest.read_text())["files"]} - {MANIFEST}
    except (OSError, ValueError, KeyError, TypeError):
        return set()
