"""Numbered checkpoints in a folder: :class:`CheckpointManager`, :func:`read_checkpoint`,
:func:`find_latest`.

A save writes the file (or, with ``sharded=True``, the DCP folder of ``sharded.py``) and its
manifest, then moves a ``latest`` pointer to it, then prunes; a kill at any point leaves
:meth:`CheckpointManager.latest` a valid checkpoint, the previous one until the pointer moved.
A torn or corrupt newest checkpoint is reported and the previous good one is used.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankwise.storage import Storage, is_remote_url, split_url
from rankwise.storage.local import TMP_MARK
from rankwise.train.checkpoint import remote, remote_sharded, sharded
from rankwise.train.checkpoint.catalogue import Catalogue, check_position
from rankwise.train.checkpoint.files import (
    CheckpointError,
    check_plain,
    load_file,
    resolve_key,
    save_file,
    verify_file,
)
from rankwise.train.checkpoint.remote_manager import RemoteCheckpointManager
from rankwise.train.checkpoint.sharded import ShardedWriter
from rankwise.train.checkpoint.staging import BackgroundSaves

__all__ = ["FORMAT_VERSION", "CheckpointManager", "find_latest", "read_checkpoint"]

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
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        keep_last: int | None = 3,
        prefix: str = "ckpt",
        *,
        sharded: bool = False,
        key: str | None = None,
    ) -> None:
        self.directory = Path(directory)
        # The folder as a store, its path not parsed as a URL: a Path is a local folder.
        storage = Storage(str(self.directory), "file", str(self.directory))
        self._catalogue = Catalogue(storage, prefix, keep_last)
        self._secret = resolve_key(key)  # never shown: not in repr or messages
        self.keep_last = keep_last
        self.prefix = prefix
        self.sharded = sharded
        self._dcp: ShardedWriter | None = None
        self._background: BackgroundSaves[Path] = BackgroundSaves()

    def __repr__(self) -> str:
        return (
            f"CheckpointManager({str(self.directory)!r}, keep_last={self.keep_last}, "
            f"prefix={self.prefix!r})"
        )

    @property
    def pointer_path(self) -> Path:
        """The JSON file naming the newest committed checkpoint."""
        return self.directory / self._catalogue.pointer_key

    def path_for(self, epoch: int, step: int) -> Path:
        """The file (or folder) a save at ``(epoch, step)`` writes (zero-padded: names sort by
        age)."""
        return self.directory / self._catalogue.name_for(epoch, step, sharded=self.sharded)

    def checkpoints(self) -> list[Path]:
        """Every checkpoint of this prefix, valid or not, oldest first (by epoch, step)."""
        return [self.directory / name for name in self._catalogue.names()]

    def probe(self) -> str | None:
        """Whether a save can write here: create the folder, then create, fsync and delete a
        small file in it. None if it can, else what failed (the path and the OS error), for
        ``fit`` to say before its first step rather than at a save one interval later."""
        probe = self.directory / f".{self.prefix}-probe-{os.getpid()}"
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

    def save(self, state: dict[str, Any], *, epoch: int, step: int) -> Path:
        """Write ``state`` as the checkpoint of ``(epoch, step)``; return its path.

        Call it on the writing rank only (see :func:`model_state_dict` for gathering sharded
        state on every rank first); sharded: on every rank. The pointer moves after the file
        and its manifest are fsynced; pruning happens after the pointer moved.
        """
        check_position(epoch, step)
        path = self.path_for(epoch, step)
        if self.sharded:
            return self._start_sharded(state, path, background=False)()
        self._remove_orphan_tmp_files()
        save_file(state, path, meta={"epoch": epoch, "step": step}, key=self._secret)
        self._commit(path)
        return path

    def _commit(self, path: Path) -> None:
        epoch, step = self._catalogue.position(path.name)
        self._catalogue.commit(path.name, {"epoch": epoch, "step": step})

    def _start_sharded(
        self, state: dict[str, Any], path: Path, *, background: bool
    ) -> Callable[[], Path]:
        """Start every rank's DCP write of ``state`` (the loop is held for the staging copy
        only); return what finishes the save once it is written."""
        if self._dcp is None:
            self._dcp = ShardedWriter()
        tmp, written, rest = self._dcp.start(state, path, background=background)

        def finish() -> Path:
            written.result()  # rank 0: every rank's shards are on disk (DCP's last gather)
            if rest is not None:  # rank 0
                self._remove_orphan_tmp_files()
                epoch, step = self._catalogue.position(path.name)
                meta = {"epoch": epoch, "step": step, "world_size": state.get("world_size")}
                sharded.publish(tmp, path, rest, meta, self._secret)
                self._commit(path)
            return path

        return finish

    def save_async(
        self, state: dict[str, Any], *, epoch: int, step: int, behind: bool = False
    ) -> concurrent.futures.Future[Path]:
        """Copy ``state``'s tensors, then write them as :meth:`save` does on a background thread.

        Blocks only for the copy (and for a previous async save still writing: one at a time,
        in order; its CPU copy is reused, so keep one manager for the run), so training can go on while the file is written; the pointer moves when the
        file is safe, exactly as with :meth:`save`. Returns a future of the path. An error in
        the background is raised by :meth:`wait` and by the next ``save_async``. ``behind``
        (not sharded): do not wait for the write running; queue behind it, replacing a queued
        save that has not started (its future is cancelled: the newest state wins). The
        interpreter waits for a pending save at exit; a kill leaves the previous checkpoint.
        """
        if self.sharded:  # every rank; DCP stages the tensors (cached buffers)
            self.wait()
            check_position(epoch, step)
            finish = self._start_sharded(state, self.path_for(epoch, step), background=True)
            return self._background.submit(lambda _: finish(), None, copy=False)
        check_plain(state, "state")  # here, not as an error on the background thread
        return self._background.submit(
            lambda snapshot: self.save(snapshot, epoch=epoch, step=step), state, behind=behind
        )

    def pending(self) -> concurrent.futures.Future[Path] | None:
        """The :meth:`save_async` not yet waited for (running or done), or None."""
        return self._background.pending()

    def wait(self, timeout: float | None = None, *, first: bool = False) -> Path | None:
        """Block until the pending :meth:`save_async` (if any; ``first``: the oldest) is on
        disk; return its path. Re-raises its error; ``TimeoutError`` after ``timeout`` s."""
        return self._background.wait(timeout, first=first)

    def latest(self) -> Path | None:
        """The newest valid checkpoint, or ``None``.

        The pointer's file is used if it verifies; otherwise older ones are tried newest
        first, with a :class:`CheckpointWarning` naming each invalid file and its fault. Files
        newer than the pointer (a save killed before its pointer moved) come last.
        """
        found = self._catalogue.first_valid(self._verify)
        return None if found is None else self.directory / found[0]

    def load_latest(self) -> tuple[Path, dict[str, Any]] | None:
        """``(path, state)`` of the newest valid checkpoint (verified once), or ``None``."""
        found = self._catalogue.first_valid(
            lambda name: read_checkpoint(self.directory / name, key=self._secret)
        )
        return None if found is None else (self.directory / found[0], found[1])

    def _verify(self, name: str) -> None:
        path = self.directory / name
        if sharded.is_sharded_path(path):
            sharded.verify_folder(path, key=self._secret)
        else:
            verify_file(path, key=self._secret)

    def _remove_orphan_tmp_files(self) -> None:
        # Left by saves killed mid-write; a live writer's files (its pid runs) are left alone.
        if not self.directory.is_dir() or os.name == "nt":  # os.kill(pid, 0) kills on Windows
            return
        for path in self.directory.glob(f".{self.prefix}-*{TMP_MARK}*"):
            pid = path.name.rsplit(TMP_MARK, 1)[1].split("-", 1)[0]
            if pid.isdigit() and not _pid_running(int(pid)):
                if path.is_dir():  # a sharded save's folder
                    shutil.rmtree(path, ignore_errors=True)
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    path.unlink()


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
            return remote_sharded.fetch(storage, name, key)
        return remote.load(storage, name, key)
    if sharded.is_sharded_path(path):
        return sharded.read_state(path, verify_shards=verify_shards, key=key)
    return load_file(path, key=key)


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
