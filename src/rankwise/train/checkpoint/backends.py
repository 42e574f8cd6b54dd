"""The steps of a checkpoint save and load that differ by where checkpoints live, behind one
interface for :class:`~rankwise.train.checkpoint.CheckpointManager`: everything else (names,
pointer, candidates, pruning: ``catalogue.py``; the background writer: ``staging.py``) is
written once above it.

- :class:`FolderSaves`: a local folder. A file is written in place by ``save_file``
  (temporary name, fsync, rename: it is visible once complete); a sharded save is a DCP folder
  every rank writes into a shared temporary folder that rank 0 renames into place
  (``sharded.py``).
- :class:`BucketSaves`: object storage, which has no rename. A file is written to a local
  temporary file exactly as on disk, then uploaded, then its manifest (``remote.py``); a
  sharded save is uploaded by every rank from a local folder of its own
  (``remote_sharded.py``).

Both answer ``location``, ``write_file``, ``start_sharded``, ``verify``, ``load``, ``probe``
and ``start``; a ``name`` is a checkpoint's name in the catalogue.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankwise.storage import Storage, StorageError
from rankwise.storage.local import TMP_MARK
from rankwise.train.checkpoint import remote, remote_sharded, sharded
from rankwise.train.checkpoint.catalogue import Catalogue
from rankwise.train.checkpoint.errors import CheckpointError
from rankwise.train.checkpoint.files import load_file, save_file, verify_file
from rankwise.train.checkpoint.manifests import manifest_path
from rankwise.train.checkpoint.sharded import ShardedWriter

__all__ = ["BucketSaves", "FolderSaves"]


class FolderSaves:
    """A local folder's saves and loads (see the module)."""

    def __init__(self, catalogue: Catalogue, key: bytes | None) -> None:
        self.catalogue = catalogue
        self.directory = catalogue.storage.local_path
        self.key = key  # the checkpoint key manifests are signed with (manifests.resolve_key)
        self._dcp: ShardedWriter | None = None

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
    ) -> Callable[[], Path]:
        """Start every rank's DCP write of ``state`` (the loop is held for the staging copy
        only); return what finishes the save once it is written: rank 0 writes the rest and
        the manifest, renames the folder into place and commits it."""
        if self._dcp is None:
            self._dcp = ShardedWriter()
        path = self.directory / name
        tmp, written, rest = self._dcp.start(state, path, background=background)

        def finish() -> Path:
            written.result()  # rank 0: every rank's shards are on disk (DCP's last gather)
            if rest is not None:  # rank 0
                self._remove_orphan_tmp_files()
                sharded.publish(tmp, path, rest, meta, self.key)
                self.catalogue.commit(name, {"epoch": meta["epoch"], "step": meta["step"]})
            return path

        return finish

    def verify(self, name: str) -> None:
        path = self.directory / name
        if sharded.is_sharded_path(path):
            sharded.verify_folder(path, key=self.key)
        else:
            verify_file(path, key=self.key)

    def load(self, name: str) -> dict[str, Any]:
        path = self.directory / name
        if sharded.is_sharded_path(path):
            return sharded.read_state(path, key=self.key)
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
    retried from the file without touching the training state again."""

    def __init__(self, catalogue: Catalogue, key: bytes | None) -> None:
        self.catalogue = catalogue
        self.storage: Storage = catalogue.storage
        self.key = key
        self._dcp = remote_sharded.RemoteShardedWriter(catalogue, key)

    def location(self, name: str) -> str:
        return self.storage.url_of(name)

    def listed(self, name: str) -> str:
        return name

    def write_file(self, state: dict[str, Any], name: str, meta: dict[str, Any]) -> None:
        """``state`` written to a local temporary file (``save_file``: the manifest's checksum
        computed while writing), then uploaded (multipart, parts in parallel), then its
        manifest."""
        with tempfile.TemporaryDirectory(prefix="rankwise-upload-") as folder:
            local = save_file(state, Path(folder) / name, meta=meta, key=self.key)
            manifest = json.loads(manifest_path(local).read_text())
            remote.upload(self.storage, local, name, manifest=manifest, key=self.key)

    def start_sharded(
        self, state: dict[str, Any], name: str, meta: dict[str, Any], *, background: bool
    ) -> Callable[[], str]:
        return self._dcp.start(state, name, meta, background=background)

    def verify(self, name: str) -> Any:
        if name.endswith(sharded.SUFFIX):
            return _found(remote_sharded.verify, self.storage, name, self.key)
        return remote.verify(self.storage, name, self.key)

    def load(self, name: str) -> dict[str, Any]:
        """The state of checkpoint ``name``, downloaded and verified once (a sharded folder's
        state names its local copy, which loading it deletes)."""
        if name.endswith(sharded.SUFFIX):
            return _found(remote_sharded.fetch, self.storage, name, self.key)
        return remote.load(self.storage, name, self.key)

    def probe(self) -> str | None:
        """None if a save can write here, else what failed, naming the URL (never a secret)."""
        try:
            self.storage.check_writable()
        except StorageError as exc:
            return str(exc).rstrip(".")
        return None

    def start(self) -> list[str]:
        """Fail now, naming the URL and the fix, when the store cannot be written; then abort
        the unfinished multipart uploads under the URL; return their keys."""
        self.storage.check_writable()
        return remote.clean_partial_uploads(self.storage)


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
