"""Numbered checkpoints in a folder or a bucket: :class:`CheckpointManager` (and
:class:`RemoteCheckpointManager`, the same manager refusing a local folder),
:func:`read_checkpoint`, :func:`find_latest`.

A save writes the file (or, with ``sharded=True``, the DCP folder of ``sharded.py``) and its
manifest, then moves a ``latest`` pointer to it, then prunes; a kill at any point leaves
:meth:`CheckpointManager.latest` a valid checkpoint, the previous one until the pointer moved.
A torn or corrupt newest checkpoint is reported and the previous good one is used.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankwise.storage import Storage, is_remote_url, split_url
from rankwise.train.checkpoint import sharded
from rankwise.train.checkpoint.backends import BucketSaves, FolderSaves, fetch_folder, load_object
from rankwise.train.checkpoint.catalogue import Catalogue, check_position
from rankwise.train.checkpoint.errors import CheckpointError
from rankwise.train.checkpoint.files import check_plain, load_file
from rankwise.train.checkpoint.manifests import resolve_key
from rankwise.train.checkpoint.staging import BackgroundSaves

__all__ = [
    "FORMAT_VERSION",
    "CheckpointManager",
    "RemoteCheckpointManager",
    "find_latest",
    "read_checkpoint",
]

FORMAT_VERSION = 1  # of the checkpoint content the trainer builds: {"format": 1, "model": ...}


class CheckpointManager:
    """Numbered checkpoints ``{prefix}-e{epoch}-s{step}.pt`` in ``directory``, newest last
    (``.dcp`` folders with ``sharded=True``; both kinds are found, verified and pruned).

    :meth:`save` writes the file and its manifest atomically, then moves the pointer
    ``{prefix}-latest.json`` to it, then deletes all but the ``keep_last`` newest (``None``
    keeps all). A kill at any point of a save leaves :meth:`latest` returning a valid
    checkpoint: the new one once the pointer has moved, the previous one before. One writer per
    directory and prefix: with several writing ranks, give each its own prefix or folder.
    Nothing is created until the first save. ``sharded``: saves write DCP folders and are
    collectives, called on every rank (each writes its shards; rank 0 the rest and the
    manifest, and moves the pointer). ``key``: the checkpoint key (default: the environment
    variable ``RANKWISE_CHECKPOINT_KEY``); with one, every manifest is signed with a MAC over
    its content and the checkpoint's name, and a checkpoint without a valid MAC is not loaded
    (see "Checkpoint trust" in docs/train.md).

    ``directory`` may also be a remote :class:`~rankwise.storage.Storage` (what
    :class:`RemoteCheckpointManager` takes): the same manager then keeps its checkpoints in
    object storage, paths being URLs (``str``); only the step that makes a finished file
    visible differs (``backends.py``).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | Storage,
        keep_last: int | None = 3,
        prefix: str = "ckpt",
        *,
        sharded: bool = False,
        key: str | None = None,
    ) -> None:
        if isinstance(directory, Storage):
            storage = directory
        else:  # a path, not parsed as a URL: a Path is a local folder
            storage = Storage(str(Path(directory)), "file", str(Path(directory)))
        self.storage = storage
        self._catalogue = Catalogue(storage, prefix, keep_last)
        self._secret = resolve_key(key)  # never shown: not in repr or messages
        self.keep_last = keep_last
        self.prefix = prefix
        self.sharded = sharded
        self._saves: FolderSaves | BucketSaves
        if storage.is_remote:
            self._saves = BucketSaves(self._catalogue, self._secret)
        else:
            self._saves = FolderSaves(self._catalogue, self._secret)
        self._background: BackgroundSaves[Any] = BackgroundSaves()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({str(self.directory)!r}, keep_last={self.keep_last}, "
            f"prefix={self.prefix!r})"
        )

    @property
    def directory(self) -> Any:
        """The folder (a ``Path``), or the URL checkpoints live under (credentials
        scrubbed)."""
        return self.storage.local_path if not self.storage.is_remote else self.storage.display_url

    @property
    def pointer_path(self) -> Any:
        """The JSON file (or object's URL) naming the newest committed checkpoint."""
        return self._saves.location(self._catalogue.pointer_key)

    def name_for(self, epoch: int, step: int) -> str:
        return self._catalogue.name_for(epoch, step, sharded=self.sharded)

    def path_for(self, epoch: int, step: int) -> Any:
        """The file (or folder, or URL) a save at ``(epoch, step)`` writes (zero-padded: names
        sort by age)."""
        return self._saves.location(self.name_for(epoch, step))

    def checkpoints(self) -> list[Any]:
        """Every checkpoint of this prefix, valid or not, oldest first (by epoch, step): paths
        in a folder, names in object storage."""
        return [self._saves.listed(name) for name in self._catalogue.names()]

    @property
    def may_stall(self) -> bool:
        """Whether a write here may go unanswered for long (an object store's silence): a
        background save then queues behind the one running rather than waiting for it. A
        local folder's write ends."""
        return self._saves.may_stall

    def probe(self) -> str | None:
        """Whether a save can write here: None if it can, else what failed (the path and the
        OS error, or the URL and the store's answer, never a secret), for ``fit`` to say
        before its first step rather than at a save one interval later."""
        return self._saves.probe()

    def start(self) -> list[str]:
        """In object storage: fail now, naming the URL and the fix, when the store cannot be
        written; then abort the unfinished multipart uploads under the URL and return their
        keys (call it once, before the first save). In a folder: nothing to do."""
        return self._saves.start()

    def save(self, state: dict[str, Any], *, epoch: int, step: int) -> Any:
        """Write ``state`` as the checkpoint of ``(epoch, step)``; return its path (URL).

        Call it on the writing rank only (see :func:`model_state_dict` for gathering sharded
        state on every rank first); sharded: on every rank. The pointer moves after the file
        and its manifest are safe (fsynced, or in the store); pruning happens after the
        pointer moved.
        """
        check_position(epoch, step)
        if self.sharded:
            return self._start_sharded(state, epoch, step, background=False)()
        name = self.name_for(epoch, step)
        self._saves.write_file(state, name, {"epoch": epoch, "step": step})
        self._catalogue.commit(name, {"epoch": epoch, "step": step})
        return self._saves.location(name)

    def _start_sharded(
        self, state: dict[str, Any], epoch: int, step: int, *, background: bool
    ) -> Callable[[], Any]:
        meta = {"epoch": epoch, "step": step, "world_size": state.get("world_size")}
        return self._saves.start_sharded(
            state, self.name_for(epoch, step), meta, background=background
        )

    def save_async(
        self, state: dict[str, Any], *, epoch: int, step: int, behind: bool = False
    ) -> concurrent.futures.Future[Any]:
        """Copy ``state``'s tensors, then write them as :meth:`save` does on a background thread.

        Blocks only for the copy (and for a previous async save still writing: one at a time,
        in order; its CPU copy is reused, so keep one manager for the run), so training can go
        on while the file is written; the pointer moves when the file is safe, exactly as with
        :meth:`save`. Returns a future of the path. An error in the background is raised by
        :meth:`wait` and by the next ``save_async``. ``behind`` (not sharded): do not wait for
        the write running; queue behind it, replacing a queued save that has not started (its
        future is cancelled: the newest state wins). The interpreter waits for a pending save
        at exit; a kill leaves the previous checkpoint.
        """
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

    def pending(self) -> concurrent.futures.Future[Any] | None:
        """The :meth:`save_async` not yet waited for (running or done), or None."""
        return self._background.pending()

    def unanswered_for(self) -> float:
        """Seconds the store has not answered the write running now: since its start or the
        store's last answer, whichever came later."""
        since = max(self._background.started_at, self.storage.answered_at)
        return time.monotonic() - since

    def wait(self, timeout: float | None = None, *, first: bool = False) -> Any:
        """Block until the pending :meth:`save_async` (if any; ``first``: the oldest) is on
        disk (in the store); return its path. Re-raises its error; ``TimeoutError`` after
        ``timeout`` s."""
        return self._background.wait(timeout, first=first)

    def latest(self) -> Any:
        """The newest valid checkpoint (a path, or a URL), or ``None``.

        The pointer's file is used if it verifies; otherwise older ones are tried newest
        first, with a :class:`CheckpointWarning` naming each invalid file and its fault. Files
        newer than the pointer (a save killed before its pointer moved) come last.
        """
        found = self._catalogue.first_valid(self._saves.verify)
        return None if found is None else self._saves.location(found[0])

    def load_latest(self) -> tuple[Any, dict[str, Any]] | None:
        """``(path, state)`` of the newest valid checkpoint (verified once), or ``None``."""
        found = self._catalogue.first_valid(self._saves.load)
        return None if found is None else (self._saves.location(found[0]), found[1])

    def read(self, location: str | os.PathLike[str], *, shards: bool = True) -> dict[str, Any]:
        """The state of the checkpoint at ``location`` (one of this manager's), verified.
        ``shards=False``: a local sharded folder's shards are checked by size only (a rank
        loading what rank 0 verified in full); a bucket's are downloaded and checked in full."""
        name = os.fspath(location).rstrip("/").rpartition("/")[2]
        return self._saves.load(name, shards=shards)


class RemoteCheckpointManager(CheckpointManager):
    """:class:`CheckpointManager` over a remote ``storage`` (object storage): the same
    manager, its paths URLs (``str``), refusing a local folder (use ``CheckpointManager``
    there). Call :meth:`start` once, before the first save. One writer per URL and prefix.

    >>> manager = RemoteCheckpointManager(Storage.for_url("memory://rankwise-doc/remote"), keep_last=2)
    >>> for step in (10, 20, 30):
    ...     _ = manager.save({"step": step}, epoch=0, step=step)
    >>> manager.checkpoints()
    ['ckpt-e000000-s000000020.pt', 'ckpt-e000000-s000000030.pt']
    >>> manager.load_latest()
    ('memory://rankwise-doc/remote/ckpt-e000000-s000000030.pt', {'step': 30})
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
        if not storage.is_remote:
            raise ValueError(
                f"{storage.display_url} is a local folder: use CheckpointManager there "
                "(it fsyncs and renames atomically)."
            )
        super().__init__(storage, keep_last, prefix, sharded=sharded, key=key)


def read_checkpoint(
    path: str | os.PathLike[str],
    *,
    verify_shards: bool = True,
    storage_options: dict[str, Any] | None = None,
    key: str | bytes | None = None,
) -> dict[str, Any]:
    """A verified checkpoint's state: a file's whole content (:func:`load_file`), or a sharded
    folder's plain part whose ``"dcp"`` entry names the folder; ``TrainState.load_state_dict``
    reads its shards into the model. ``verify_shards=False`` checks a folder's shards by size
    only (a rank loading what rank 0 verified in full). ``path`` may be an object's URL
    (``s3://bucket/run/ckpt-e000001-s000000300.pt``, or a sharded folder's ``...300.dcp``),
    reached with ``storage_options``: it is downloaded, verified against its manifest and
    loaded (a folder's local copy is deleted once its shards are loaded). ``key``: the
    checkpoint key (default: ``RANKWISE_CHECKPOINT_KEY``); with one, a checkpoint whose
    manifest carries no valid MAC is refused. A name that claims another epoch or step
    (``-e{epoch}-s{step}``) than the checkpoint holds is refused, key or not."""
    if is_remote_url(path):
        url = os.fspath(path).rstrip("/")
        folder, _, name = split_url(url)[1].rpartition("/")
        if not folder or not name:
            raise CheckpointError(
                f"checkpoint URL {os.fspath(path)} names no checkpoint; pass the URL of one "
                "(e.g. s3://BUCKET/RUN/ckpt-e000001-s000000300.pt, or a sharded checkpoint's "
                "...300.dcp folder), or resume='auto'."
            )
        storage = Storage.for_url(url.rpartition("/")[0], storage_options)
        if sharded.is_sharded_path(name):
            return fetch_folder(storage, name, key)
        return load_object(storage, name, key)
    if sharded.is_sharded_path(path):
        return sharded.read_state(path, verify_shards=verify_shards, key=key)
    return load_file(path, key=key)


def find_latest(
    directory: str | os.PathLike[str],
    prefix: str = "ckpt",
    *,
    key: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Path | str | None:
    """The newest valid checkpoint in ``directory`` (see :meth:`CheckpointManager.latest`;
    ``key``: the checkpoint key, default ``RANKWISE_CHECKPOINT_KEY``). ``directory`` may be
    an object store's URL, as :func:`read_checkpoint`'s path may (reached with
    ``storage_options``): the newest valid checkpoint's URL is returned."""
    if is_remote_url(directory):
        storage = Storage.for_url(directory, storage_options)
        return RemoteCheckpointManager(storage, prefix=prefix, key=key).latest()
    return CheckpointManager(directory, prefix=prefix, key=key).latest()
