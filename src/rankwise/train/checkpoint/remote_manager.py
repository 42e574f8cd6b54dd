"""Numbered checkpoints in object storage: :class:`RemoteCheckpointManager`, the bucket's
counterpart of the folder's :class:`~rankwise.train.checkpoint.CheckpointManager`.

Same names (``{prefix}-e{epoch}-s{step}.pt``), same pointer, same manifests, same guarantees,
on a store with no rename (see ``remote.py``): a save writes the state to a local temporary
file exactly as on disk (``save_file``: the manifest's checksum is computed while writing),
uploads it (multipart, parts in parallel), then its manifest, then moves the pointer, then
prunes. :meth:`~RemoteCheckpointManager.save_async` runs all of that on the one background
thread, the loop held only for the snapshot. With ``sharded=True`` (``strategy="fsdp"``) a
save is a DCP folder that every rank writes its shards to (``remote_sharded.py``); the manager
finds, verifies and loads both kinds. Staging to a local file rather than streaming
``torch.save`` into the upload: the write to local disk is quick next to the upload, the
checksum is known before the first byte goes up, and a failed upload is retried from the file
without touching the training state again.

>>> manager = RemoteCheckpointManager(Storage.for_url("memory://rankwise-doc/remote"), keep_last=2)
>>> for step in (10, 20, 30):
...     _ = manager.save({"step": step}, epoch=0, step=step)
>>> manager.checkpoints()
['ckpt-e000000-s000000020.pt', 'ckpt-e000000-s000000030.pt']
>>> url, state = manager.load_latest()
>>> url, state
('memory://rankwise-doc/remote/ckpt-e000000-s000000030.pt', {'step': 30})
"""

from __future__ import annotations

import concurrent.futures
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankwise.storage import Storage, StorageError
from rankwise.train.checkpoint import remote, remote_sharded, sharded
from rankwise.train.checkpoint.catalogue import Catalogue, check_position
from rankwise.train.checkpoint.files import (
    CheckpointError,
    check_plain,
    manifest_path,
    resolve_key,
    save_file,
)
from rankwise.train.checkpoint.staging import BackgroundSaves

__all__ = ["RemoteCheckpointManager"]


class RemoteCheckpointManager:
    """Numbered checkpoints under ``storage``'s URL (see the module); the interface of
    :class:`~rankwise.train.checkpoint.CheckpointManager` with URLs (``str``) for paths.

    :meth:`start` checks that the store is reachable and writable and aborts the multipart
    uploads a killed writer left (call it once, before the first save). One writer per URL and
    prefix. ``sharded``: saves write DCP folders and are collectives, called on every rank
    (each uploads its shards; rank 0 the rest and the manifest, and moves the pointer).
    ``key``: the checkpoint key, as ``CheckpointManager``'s (default:
    ``RANKWISE_CHECKPOINT_KEY``).
    """

    def __init__(
        self,
        storage: Storage,
        keep_last: int | None = 3,
        prefix: str = "ckpt",
        *,
        sharded: bool = False,
        key: str | None = None,
    ) -> None:
        self._catalogue = Catalogue(storage, prefix, keep_last)
        self._secret = resolve_key(key)  # never shown: not in repr or messages
        if not storage.is_remote:
            raise ValueError(
                f"{storage.display_url} is a local folder: use CheckpointManager there "
                "(it fsyncs and renames atomically)."
            )
        self.storage = storage
        self.keep_last = keep_last
        self.prefix = prefix
        self.sharded = sharded
        self._dcp = remote_sharded.RemoteShardedWriter(self._catalogue, self._secret)
        self._background: BackgroundSaves[str] = BackgroundSaves()

    def __repr__(self) -> str:
        return (
            f"RemoteCheckpointManager({self.directory!r}, keep_last={self.keep_last}, "
            f"prefix={self.prefix!r})"
        )

    @property
    def directory(self) -> str:
        """The URL checkpoints live under (credentials scrubbed)."""
        return self.storage.display_url

    def start(self) -> list[str]:
        """Fail now, naming the URL and the fix, when the store cannot be written; then abort
        the unfinished multipart uploads under the URL; return their keys."""
        self.storage.check_writable()
        return remote.clean_partial_uploads(self.storage)

    def probe(self) -> str | None:
        """Whether a save can write here (see ``CheckpointManager.probe``): None if it can,
        else what failed, naming the URL (never a secret)."""
        try:
            self.storage.check_writable()
        except StorageError as exc:
            return str(exc).rstrip(".")
        return None

    def name_for(self, epoch: int, step: int) -> str:
        return self._catalogue.name_for(epoch, step, sharded=self.sharded)

    def path_for(self, epoch: int, step: int) -> str:
        """The URL a save at ``(epoch, step)`` writes."""
        return self.storage.url_of(self.name_for(epoch, step))

    def checkpoints(self) -> list[str]:
        """Every checkpoint name of this prefix (files and sharded folders), valid or not,
        oldest first."""
        return self._catalogue.names()

    def save(self, state: dict[str, Any], *, epoch: int, step: int) -> str:
        """Write ``state`` as the checkpoint of ``(epoch, step)``; return its URL once data,
        manifest and pointer are in the store (then prune). Sharded: on every rank."""
        check_position(epoch, step)
        name = self.name_for(epoch, step)
        if self.sharded:
            return self._start_sharded(state, epoch, step, background=False)()
        with tempfile.TemporaryDirectory(prefix="rankwise-upload-") as folder:
            meta = {"epoch": epoch, "step": step}
            local = save_file(state, Path(folder) / name, meta=meta, key=self._secret)
            manifest = json.loads(manifest_path(local).read_text())
            remote.publish(
                self.storage,
                local,
                name,
                catalogue=self._catalogue,
                pointer={"epoch": epoch, "step": step},
                manifest=manifest,
                key=self._secret,
            )
        return self.storage.url_of(name)

    def save_async(
        self, state: dict[str, Any], *, epoch: int, step: int, behind: bool = False
    ) -> concurrent.futures.Future[str]:
        """Copy ``state``'s tensors, then :meth:`save` them on the background thread (one
        save in flight; ``behind``: queued behind the one running, the newest state winning;
        see ``CheckpointManager.save_async``)."""
        if self.sharded:  # every rank; DCP stages the tensors (cached buffers)
            self.wait()
            check_position(epoch, step)
            finish = self._start_sharded(state, epoch, step, background=True)
            return self._background.submit(lambda _: finish(), None, copy=False)
        check_position(epoch, step)
        check_plain(state, "state")  # here, not as an error on the background thread
        return self._background.submit(
            lambda snapshot: self.save(snapshot, epoch=epoch, step=step), state, behind=behind
        )

    def _start_sharded(
        self, state: dict[str, Any], epoch: int, step: int, *, background: bool
    ) -> Callable[[], str]:
        meta = {"epoch": epoch, "step": step, "world_size": state.get("world_size")}
        return self._dcp.start(state, self.name_for(epoch, step), meta, background=background)

    def pending(self) -> concurrent.futures.Future[str] | None:
        return self._background.pending()

    def unanswered_for(self) -> float:
        """Seconds the store has not answered the write running now: since its start or the
        store's last answer, whichever came later."""
        since = max(self._background.started_at, self.storage.answered_at)
        return time.monotonic() - since

    def wait(self, timeout: float | None = None, *, first: bool = False) -> str | None:
        """Block until the pending :meth:`save_async` (``first``: the oldest) is in the store;
        return its URL. Re-raises its error; ``TimeoutError`` after ``timeout`` s."""
        return self._background.wait(timeout, first=first)

    def latest(self) -> str | None:
        """The URL of the newest checkpoint that verifies, or ``None``."""
        found = self._catalogue.first_valid(self._verify)
        return None if found is None else self.storage.url_of(found[0])

    def load_latest(self) -> tuple[str, dict[str, Any]] | None:
        """``(url, state)`` of the newest valid checkpoint (downloaded and verified once; a
        sharded folder's state names its local copy, which loading it deletes)."""
        found = self._catalogue.first_valid(self._load)
        return None if found is None else (self.storage.url_of(found[0]), found[1])

    def read(self, url: str) -> dict[str, Any]:
        """The state of the checkpoint at ``url`` (one of this manager's), verified."""
        return self._load(url.rstrip("/").rpartition("/")[2])

    def _verify(self, name: str) -> Any:
        if name.endswith(sharded.SUFFIX):
            return _found(remote_sharded.verify, self.storage, name, self._secret)
        return remote.verify(self.storage, name, self._secret)

    def _load(self, name: str) -> dict[str, Any]:
        if name.endswith(sharded.SUFFIX):
            return _found(remote_sharded.fetch, self.storage, name, self._secret)
        return remote.load(self.storage, name, self._secret)


def _found(
    take: Callable[[Storage, str, bytes | None], dict[str, Any]],
    storage: Storage,
    name: str,
    key: bytes | None,
) -> Any:
    """``take(storage, name, key)``; a folder listed but empty (a store that keeps the name of
    a pruned folder, as ``memory://`` does) is a checkpoint that is not there: skipped."""
    try:
        return take(storage, name, key)
    except FileNotFoundError as e:
        raise CheckpointError(str(e)) from None
