"""Sharded (FSDP2) checkpoints in object storage: ``sharded.py``'s DCP folders on a store with no
rename, with the guarantees of the bucket's checkpoint files (``remote.py``).

A checkpoint is a folder of objects under the URL, written in this order::

    ckpt-e000001-s000000008.dcp/
        __0_0.distcp, __1_0.distcp, ...  each rank's shards, uploaded by that rank
        .metadata                        DCP's index of the shards (rank 0)
        train_state.pt                   the plain rest of the state (rank 0)
        manifest.json                    size and XXH3-128 of every file above (rank 0, last)
    ckpt-latest.json                     the pointer, moved after the manifest is up

The design, and why it is this one:

- Every rank writes its DCP files to a local temporary folder of its own, exactly as a save
  to disk does (:class:`~rankwise.train.checkpoint.sharded.ShardedWriter`: ``async_save`` on
  the background gloo group, the loop held for the staging copy only), then, on its
  background thread, hashes them and uploads them itself through :class:`Storage` (multipart
  for large files, retries with one warning per outage, errors naming the URL, never a
  secret). Not torch's ``FsspecWriter`` streaming into the bucket: uploading finished local
  files gives the checksums before the first byte goes up, retries a failed upload from the
  file, keeps every call to the store in the one layer that retries and names the URL, and
  leaves no upload that rankwise's start does not abort (``CheckpointManager.start``).
- The ranks' ``(name, size, xxh3)`` lists are gathered over the background group as plain
  data (``all_gather_plain``: never a peer's pickle), each with the rank's error if its
  upload failed: no file is vouched for unless every rank's files are up.
- Rank 0 then uploads ``train_state.pt``, then the manifest (from here the folder is a
  checkpoint a reader trusts), then moves the pointer, then prunes (each folder's manifest
  first); its outcome is broadcast back, so every rank reports the same save as done or
  failed. A kill at any point leaves the previous checkpoint as the latest valid one.

A reader trusts a folder only when its manifest exists, lists every object in the folder (and
``.metadata``), carries a valid MAC when a checkpoint key is set, and every file matches it:
:func:`fetch` downloads the folder to a local temporary one and verifies it there with the
local folder's own code (``sharded.read_state``, messages naming the URL); ``load_shards``
loads it with DCP, which reshards onto any world size, then deletes it. Every rank downloads
the whole folder (the shards a rank needs may come from any saved rank's files), so each
needs room for one checkpoint in its temporary folder (``TMPDIR``) while it loads.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import rankwise.distributed as rd
from rankwise.storage import Storage, StorageError
from rankwise.storage.local import json_bytes
from rankwise.train.checkpoint import sharded
from rankwise.train.checkpoint.catalogue import Catalogue
from rankwise.train.checkpoint.faults import fault_point
from rankwise.train.checkpoint.manifests import checksum_of, sign
from rankwise.train.checkpoint.sharded import MANIFEST, REST, ShardedWriter

__all__ = ["RemoteShardedWriter", "fetch", "verify"]

# What a rank's failure travels as between ranks: (kind, storage reason, message), plain data.
Failure = tuple[str, str, str]


class RemoteShardedWriter:
    """Every rank's side of sharded saves to one URL (see the module): it keeps DCP's staging
    buffers and the background group from save to save."""

    def __init__(self, catalogue: Catalogue, key: str | bytes | None = None) -> None:
        self.catalogue = catalogue  # the checkpoints of the URL: pointer and pruning
        self.storage = catalogue.storage
        self.key = key  # the checkpoint key manifests are signed with (manifests.resolve_key)
        self._dcp = ShardedWriter()

    def start(
        self, state: dict[str, Any], name: str, meta: dict[str, Any], *, background: bool
    ) -> Callable[[], str]:
        """Start every rank's DCP write of ``state`` into a local folder of its own (a
        collective; in the background the loop is held for the staging copy only); return
        what uploads and publishes checkpoint ``name`` (a collective on the background group,
        run on every rank) and returns its URL."""
        local = Path(tempfile.mkdtemp(prefix="rankwise-dcp-"))
        try:
            group = self._dcp.background_group()  # made here, on the loop's thread
            _, written, rest = self._dcp.start(state, local, background=background, tmp=local)
        except BaseException:
            shutil.rmtree(local, ignore_errors=True)
            raise

        def finish() -> str:
            try:
                return self._finish(written, local, rest, name, meta, group)
            finally:
                shutil.rmtree(local, ignore_errors=True)

        return finish

    def _finish(
        self,
        written: concurrent.futures.Future[Any],
        local: Path,
        rest: dict[str, Any] | None,
        name: str,
        meta: dict[str, Any],
        group: dist.ProcessGroup | None,
    ) -> str:
        written.result()  # every rank's files are written (DCP's last step gathers them all)
        folder = self.storage.child(name)
        files: dict[str, Any] = {}
        error: BaseException | None = None
        try:
            files = _upload(folder, local)
        except Exception as e:  # every rank must reach the gather below
            error = e
        everyone = rd.all_gather_plain((files, _failure(error)), group=group)
        self._raise_first(dict(enumerate(f for _, f in everyone)), error, folder)
        if rest is not None:  # rank 0: the rest, the manifest, the pointer, the pruning
            try:
                listed = {k: v for part, _ in everyone for k, v in part.items()}
                self._publish(folder, name, listed, rest, local, meta)
            except Exception as e:
                error = e
        outcome = rd.broadcast_plain(_failure(error), group=group)  # rank 0's
        self._raise_first({0: outcome}, error, folder)
        return folder.display_url

    def _publish(
        self,
        folder: Storage,
        name: str,
        files: dict[str, Any],
        rest: dict[str, Any],
        local: Path,
        meta: dict[str, Any],
    ) -> None:
        path = local / REST
        torch.save(rest, path)
        files = {**files, REST: {"size": path.stat().st_size, "xxh3_128": checksum_of(path)}}
        folder.put(path, REST)
        fault_point("before-manifest")
        folder.put(json_bytes(sign(sharded.new_manifest(files, meta), name, self.key)), MANIFEST)
        self.catalogue.commit(name, {"epoch": meta["epoch"], "step": meta["step"]})

    @staticmethod
    def _raise_first(
        failures: dict[int, Failure | None], mine: BaseException | None, folder: Storage
    ) -> None:
        """Raise this rank's own error, else the first rank's that failed, as the same kind on
        every rank: a store's fault as a StorageError (the writer warns and goes on), anything
        else as an OSError (the writer stops every rank)."""
        if isinstance(mine, (StorageError, OSError)):
            raise mine
        if mine is not None:
            failures = {rd.get_rank(): _failure(mine)}
        for rank, failure in failures.items():
            if failure is None:
                continue
            kind, reason, text = failure
            if kind == "storage":
                raise StorageError(
                    f"rank {rank} could not write its part of {folder.display_url}: {text}",
                    url=folder.display_url,
                    reason=reason,
                )
            raise OSError(
                f"rank {rank} could not write its part of {folder.display_url}: {text}"
            ) from mine


def _failure(error: BaseException | None) -> Failure | None:
    if error is None:
        return None
    if isinstance(error, StorageError):
        return ("storage", error.reason, str(error))
    return ("other", "", f"{type(error).__name__}: {error}")


def _upload(folder: Storage, local: Path) -> dict[str, Any]:
    """Hash and upload every file of ``local`` into ``folder``; return their manifest entries.
    Fault point ``mid-upload``: once each file's first part is up (the whole object, for one
    part)."""
    files = sharded.file_entries(local)
    for name in files:
        first = [True]

        def uploaded(_: int, first: list[bool] = first) -> None:
            if first[0]:
                first[0] = False
                fault_point("mid-upload")

        folder.put(local / name, name, uploaded=uploaded)
    return files


def fetch(storage: Storage, name: str, key: str | bytes | None = None) -> dict[str, Any]:
    """Folder ``name`` downloaded to a local temporary folder and verified there against its
    manifest: its plain state (``sharded.read_state``), whose ``"dcp"`` entry names the local
    copy that ``load_shards`` reads and then deletes. Raises :class:`CheckpointError` naming
    the URL and the fault, as a local folder's: the manifest must list every object in the
    folder (only listed ones are downloaded) and, with a checkpoint ``key`` (default:
    ``RANKWISE_CHECKPOINT_KEY``), carry a MAC over its content and ``name``."""
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


def verify(storage: Storage, name: str, key: str | bytes | None = None) -> dict[str, Any]:
    """Check folder ``name`` against its manifest (downloaded, verified, deleted); return its
    plain state or raise :class:`CheckpointError` saying what is wrong (see :func:`fetch`)."""
    state = fetch(storage, name, key)
    shutil.rmtree(state["dcp"]["folder"], ignore_errors=True)
    return state
