"""Sharded (FSDP2) checkpoints: one DCP folder per checkpoint, each rank writing its shards.

Under ``strategy="fsdp"`` a checkpoint is a folder, not a file::

    ckpt-e000002-s000000300.dcp/
        __0_0.distcp, __1_0.distcp, ...  each rank's shards of the model and optimizer tensors
        .metadata                        DCP's index of the shards (rank 0)
        train_state.pt                   everything else (rank 0): epoch, step, sampler cursor,
                                         the epoch's sums, RNG, config, world size, scheduler,
                                         history, the optimizer's param groups
        manifest.json                    size and XXH3-128 of every file above (rank 0, last),
                                         and its MAC when a checkpoint key is set

Every rank writes its own shards with ``torch.distributed.checkpoint.async_save``: the loop is
held for the staging copy only; the write and DCP's collectives (plans, metadata) run on a
background thread over a gloo group of their own, so they never interleave with training's
collectives on the default group. One :class:`ShardedWriter` serves a folder and a bucket alike;
the one step that differs, making the finished local files visible under the checkpoint's name,
is its ``target``'s (``backends.py``): on disk every rank writes into one temporary folder
that rank 0 renames into place once ``train_state.pt`` and the manifest are in it; in object
storage, which has no rename, every rank writes a local folder of its own and uploads its
files, and rank 0 uploads ``train_state.pt`` and then the manifest. Then the manager's
catalogue moves its pointer and prunes. The rules are a checkpoint file's: a folder without a
manifest that matches is never loaded, and :meth:`CheckpointManager.latest` falls back past it.

The DCP part holds tensors only: DCP unpickles non-tensor entries with ``weights_only=False``,
so every plain value goes to ``train_state.pt``, read with ``weights_only=True``. DCP also
unpickles ``.metadata`` with plain ``pickle``: code, if the file is not the one written. So a
folder is trusted only when its manifest lists every file in it (an unlisted one is refused:
DCP would read a planted ``__0.metadata``), lists ``.metadata``, and every file matches; the
``.metadata`` DCP unpickles is the very bytes checked, on every rank (:func:`load_shards`
hands DCP a reader of them). A checksum anyone can recompute; with a checkpoint key the
manifest carries a MAC too (``manifests.check_trust``), without one the folder must be trusted as
code. Loading
(:func:`load_shards`) reads the shards into the live model's and optimizer's layout with
``torch.distributed.checkpoint.load``, which reshards onto any world size, or into a plain
model in a world of one.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import io
import json
import os
import pickle
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import xxhash
from torch import nn

import rankwise.distributed as rd
from rankwise.storage import StorageError
from rankwise.storage.local import write_atomic
from rankwise.train.checkpoint.errors import CheckpointError
from rankwise.train.checkpoint.faults import fault_point
from rankwise.train.checkpoint.files import check_plain
from rankwise.train.checkpoint.manifests import (
    USE_ANOTHER,
    check_bytes,
    check_content,
    check_position,
    check_trust,
    checksum_of,
    sign,
)
from rankwise.train.checkpoint.portable import (
    dcp_view,
    in_group,
    load_optimizer_state_dict,
    optimizer_state_dict,
)
from rankwise.train.checkpoint.staging import snapshot

__all__ = [
    "MANIFEST",
    "METADATA",
    "REST",
    "SUFFIX",
    "ShardTarget",
    "ShardedWriter",
    "file_entries",
    "is_sharded_path",
    "load_shards",
    "new_manifest",
    "read_state",
    "sharded_state_dicts",
    "verify_folder",
]

SUFFIX = ".dcp"
MANIFEST = "manifest.json"
REST = "train_state.pt"
METADATA = ".metadata"  # DCP's index of the shards, which DCP unpickles
_VERSION = 1  # of the folder manifest


def is_sharded_path(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a sharded checkpoint folder (by its suffix, ``.dcp``)."""
    return Path(path).suffix == SUFFIX


def sharded_state_dicts(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's and the optimizer's state as each rank holds it: DTensor shards under FSDP2
    (nothing is gathered), plain tensors for a plain model. Keys are the plain module's names.
    An optimizer that never stepped gives its hyper-parameters alone (no zero step)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    view = dcp_view(model)
    model_state: dict[str, Any] = get_model_state_dict(view)
    if not optimizer.state:
        return model_state, optimizer_state_dict(model, optimizer)  # hyper-parameters alone
    return model_state, dict(get_optimizer_state_dict(view, optimizer))


def _split(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors for DCP, plain rest)`` of a sharded :meth:`TrainState.state_dict`."""
    optimizer = state["optimizer"]
    tensors: dict[str, Any] = {"model": state["model"]}
    if optimizer.get("state"):
        tensors["optimizer"] = optimizer["state"]
    rest = {
        **state,
        "model": None,
        "optimizer": {"state": {}, "param_groups": optimizer["param_groups"]},
        "dcp": {"optimizer": "optimizer" in tensors},
    }
    return tensors, rest


# What a rank's failure travels as between ranks: (kind, storage reason, message), plain data.
Failure = tuple[str, str, str]


class ShardTarget(Protocol):
    """Where a sharded save's files become visible: the one step that differs between a local
    folder and object storage (``backends.FolderSaves``, ``backends.BucketSaves``)."""

    def scratch(self, name: str) -> Path:
        """The local folder this rank's DCP files are written to (a collective where it is
        shared by every rank)."""

    def share(self, tmp: Path, name: str) -> dict[str, dict[str, Any]]:
        """Once this rank's files are written: make them visible under checkpoint ``name``
        (or nothing, where ``tmp`` is already shared); return the manifest entries this rank
        vouches for."""

    def share_file(self, tmp: Path, name: str, file: str) -> None:
        """Rank 0: make ``tmp/file`` visible under checkpoint ``name`` too."""

    def seal(self, tmp: Path, name: str, manifest: dict[str, Any]) -> None:
        """Rank 0, last: the signed ``manifest``, after which the folder is a checkpoint a
        reader trusts (a rename into place, or the manifest's upload)."""

    def release(self, tmp: Path) -> None:
        """The save ended (done or failed): drop what of ``tmp`` is this rank's to drop."""

    def location(self, name: str) -> Any:
        """Checkpoint ``name``'s path (or URL)."""


class ShardedWriter:
    """Every rank's side of sharded saves to one store, a folder or a bucket alike: it keeps
    DCP's staging buffers (reused from save to save) and the background process group.

    A save (:meth:`start`): every rank writes its shards with DCP into a local folder
    (``target.scratch``: one shared temporary folder beside the checkpoint on disk, a folder
    of each rank's own for a bucket); in the background the loop is held for the staging copy
    only. Then, on the writer thread, each rank makes its files visible (``target.share``: an
    upload, or nothing on disk), the ranks gather what each vouches for and its error as plain
    data (no file is vouched for unless every rank's are there), rank 0 writes the plain rest
    (``train_state.pt``) and the manifest last (``target.seal``: the rename into place, or the
    manifest's upload), moves the pointer and prunes (``commit``: the catalogue's); its
    outcome is broadcast, so every rank reports the same save as done or failed. A kill at
    any point leaves the previous checkpoint the latest valid one.

    Fault points: ``mid-upload`` (a bucket: once each file's first part is up),
    ``before-manifest``, ``before-rename`` (a folder), then the catalogue's."""

    def __init__(
        self,
        target: ShardTarget,
        commit: Callable[[str, dict[str, Any]], None],
        key: bytes | None,
    ) -> None:
        self.target = target
        self.commit = commit  # the catalogue's: move the pointer to a checkpoint, then prune
        self.key = key  # the checkpoint key manifests are signed with (manifests.resolve_key)
        self._group: dist.ProcessGroup | None = None
        self._stager: Any = None

    def start(
        self, state: dict[str, Any], name: str, meta: dict[str, Any], *, background: bool
    ) -> Callable[[], Any]:
        """Start every rank's DCP write of ``state`` (a collective); return what makes it
        checkpoint ``name`` once it is written (a collective on the background group, run on
        every rank) and returns its location."""
        import torch.distributed.checkpoint as dcp

        tensors, rest = _split(state)
        check_plain(rest, "state")  # here, not as an error on the background thread
        group = self.background_group()  # made here, on the loop's thread
        tmp = self.target.scratch(name)
        try:
            storage = dcp.FileSystemWriter(str(tmp))
            no_dist = _no_dist()
            written: concurrent.futures.Future[Any]
            if background:
                response = dcp.async_save(
                    tensors,
                    storage_writer=storage,
                    process_group=group,
                    async_stager=self._staging(),
                    no_dist=no_dist,
                )
                # A plain future of the upload (staging was synchronous); a newer DCP may
                # answer with a response holding it.
                written = getattr(response, "upload_completion", response)  # type: ignore[arg-type]
            else:
                written = concurrent.futures.Future()
                written.set_result(dcp.save(tensors, storage_writer=storage, no_dist=no_dist))
        except BaseException:
            self.target.release(tmp)
            raise
        plain = snapshot(rest) if rd.is_master() else None

        def finish() -> Any:
            try:
                return self._finish(written, tmp, plain, name, meta, group)
            finally:
                self.target.release(tmp)

        return finish

    def _finish(
        self,
        written: concurrent.futures.Future[Any],
        tmp: Path,
        rest: dict[str, Any] | None,
        name: str,
        meta: dict[str, Any],
        group: dist.ProcessGroup | None,
    ) -> Any:
        written.result()  # every rank's files are written (DCP's last step gathers them all)
        where = str(self.target.location(name))
        files: dict[str, Any] = {}
        error: BaseException | None = None
        try:
            files = self.target.share(tmp, name)
        except Exception as e:  # every rank must reach the gather below
            error = e
        everyone = rd.all_gather_plain((files, _failure(error)), group=group)
        _raise_first(dict(enumerate(f for _, f in everyone)), error, where)
        if rest is not None:  # rank 0: the rest, the manifest, the pointer, the pruning
            try:
                listed = {k: v for part, _ in everyone for k, v in part.items()}
                self._publish(tmp, name, listed, rest, meta)
            except Exception as e:
                error = e
        outcome = rd.broadcast_plain(_failure(error), group=group)  # rank 0's
        _raise_first({0: outcome}, error, where)
        return self.target.location(name)

    def _publish(
        self,
        tmp: Path,
        name: str,
        files: dict[str, Any],
        rest: dict[str, Any],
        meta: dict[str, Any],
    ) -> None:
        path = tmp / REST
        write_atomic(path, lambda f: torch.save(rest, f))
        files = {**files, REST: {"size": path.stat().st_size, "xxh3_128": checksum_of(path)}}
        self.target.share_file(tmp, name, REST)
        fault_point("before-manifest")
        self.target.seal(tmp, name, sign(new_manifest(files, meta), name, self.key))
        self.commit(name, {"epoch": meta["epoch"], "step": meta["step"]})

    def background_group(self) -> dist.ProcessGroup | None:
        """The gloo group of the background writes (None in a world of one); made on first use,
        a collective then. DCP's collectives run on its writer thread; on the default group
        they would interleave with the loop's. gloo: DCP's async save needs a CPU group."""
        if self._group is None and in_group():
            self._group = dist.new_group(backend="gloo")
        return self._group

    def _staging(self) -> Any:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if self._stager is None:
            # Synchronous staging into cached CPU storages (refilled by the next save); pinned
            # where CUDA is, so device-to-host copies are fast.
            pinned = torch.cuda.is_available()
            self._stager = DefaultStager(StagingOptions(pinned, False, False, False))
        return self._stager


def _raise_first(
    failures: dict[int, Failure | None], mine: BaseException | None, where: str
) -> None:
    """Raise this rank's own error, else the first rank's that failed, as the same kind on every
    rank: a store's fault as a StorageError (the writer warns and goes on), anything else as an
    OSError (the writer stops every rank)."""
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
                f"rank {rank} could not write its part of {where}: {text}",
                url=where,
                reason=reason,
            )
        raise OSError(f"rank {rank} could not write its part of {where}: {text}") from mine


def _failure(error: BaseException | None) -> Failure | None:
    if error is None:
        return None
    if isinstance(error, StorageError):
        return ("storage", error.reason, str(error))
    return ("other", "", f"{type(error).__name__}: {error}")


def _no_dist() -> bool:
    """Whether DCP runs without a group (a world of one). DCP then warns, on every save and
    load, that it assumes a single process: that is rankwise's intent, so that one warning
    (matched by its text) is silenced; it is raised on DCP's writer thread too, where a
    ``catch_warnings`` block would not be thread-safe."""
    if in_group():
        return False
    warnings.filterwarnings(
        "ignore",
        message="torch.distributed is disabled, unavailable or uninitialized, assuming the "
        "intent is to (save|load) in a single process",
        category=UserWarning,
    )
    return True


def file_entries(folder: Path) -> dict[str, dict[str, Any]]:
    """``{name: {"size", "xxh3_128"}}`` of every file under ``folder`` (names relative, with
    ``/``): what a folder's manifest lists."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        files[name] = {"size": path.stat().st_size, "xxh3_128": checksum_of(path)}
    return files


def new_manifest(files: dict[str, dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """A sharded folder's manifest: every file's size and XXH3-128 (``files``), and ``meta``."""
    return {
        "version": _VERSION,
        "layout": "dcp",
        "files": files,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "meta": meta,
    }


def verify_folder(
    folder: str | os.PathLike[str],
    *,
    shards: bool = True,
    source: str | None = None,
    name: str | None = None,
    key: str | bytes | None = None,
    present: set[str] | None = None,
) -> dict[str, Any]:
    """Check a sharded checkpoint folder against its manifest; return the manifest or raise
    :class:`CheckpointError` naming the folder, the file and the fault.

    The manifest must list every file in the folder and ``.metadata``, and with a checkpoint
    ``key`` (default: ``RANKWISE_CHECKPOINT_KEY``) carry a MAC over its content and the
    folder's ``name`` (default: the folder's own); a name claiming another epoch or step than
    the manifest's is refused. ``shards=False`` checks every file's size but only
    ``train_state.pt``'s and ``.metadata``'s checksums (for ranks that load a folder rank 0
    has verified in full). ``source``: what messages name instead of ``folder`` (the URL a
    downloaded copy came from); ``present``: the names the checkpoint holds there (default:
    the files in ``folder``)."""
    path = Path(folder)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {source or path} does not exist.")
    return _verify(path, source or str(path), shards, name or path.name, key, present)


def _verify(
    folder: Path,
    shown: str,
    shards: bool,
    name: str,
    key: str | bytes | None,
    present: set[str] | None,
) -> dict[str, Any]:
    what = f"checkpoint {shown}"
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = {str(k): (int(v["size"]), str(v["xxh3_128"])) for k, v in manifest["files"].items()}
    except FileNotFoundError:
        raise CheckpointError(
            f"{what} has no manifest ({MANIFEST}): its save did not finish, or "
            "it was copied without it; it cannot be verified, so it is not used. Copy the "
            f"whole folder, or {USE_ANOTHER}."
        ) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{what}: its manifest {MANIFEST} is unreadable ({e}).") from e
    check_trust(manifest, name, key, what, MANIFEST)
    if present is None:
        present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    unlisted = sorted(present - set(files) - {MANIFEST})
    if unlisted:
        raise CheckpointError(
            f"{what} holds {', '.join(unlisted)}, which its manifest does not list (added "
            "after it was written, or its entry removed); torch would read it, so the "
            f"checkpoint is not used. Fix: {USE_ANOTHER}."
        )
    for needed in (METADATA, REST):
        if needed not in files:
            raise CheckpointError(
                f"{what}: its manifest lists no {needed} (a sharded checkpoint's manifest "
                "lists it: the manifest was altered or is not rankwise's), so it is not used. "
                f"Fix: {USE_ANOTHER}."
            )
    for file, (size, digest) in sorted(files.items()):
        if file not in present:  # also a listed name outside the folder ("../x")
            raise CheckpointError(
                f"{what} lacks {file}, which its manifest lists (a file lost or "
                f"not copied); it is not used: {USE_ANOTHER}."
            )
        path = folder / file
        # Without ``shards`` a size that differs still fails here, with the full message.
        if shards or file in (REST, METADATA) or path.stat().st_size != size:
            check_bytes(path, size, digest, "xxh3_128", f"{what}: {file}")
    return dict(manifest)


def read_state(
    folder: str | os.PathLike[str],
    *,
    verify_shards: bool = True,
    source: str | None = None,
    name: str | None = None,
    key: str | bytes | None = None,
    present: set[str] | None = None,
) -> dict[str, Any]:
    """The plain part of a verified sharded checkpoint (see :func:`verify_folder` for the
    arguments), with ``"dcp"`` naming the folder whose shards :func:`load_shards` reads
    (``TrainState.load_state_dict`` does) and the ``.metadata`` it was verified against."""
    folder = Path(folder)
    shown = source or str(folder)
    manifest = verify_folder(
        folder, shards=verify_shards, source=source, name=name, key=key, present=present
    )
    data = (folder / REST).read_bytes()  # the bytes checked are the bytes loaded
    size, digest = manifest["files"][REST]["size"], manifest["files"][REST]["xxh3_128"]
    check_content(
        f"checkpoint {shown}: {REST}",
        int(size),
        str(digest),
        "xxh3_128",
        len(data),
        lambda: xxhash.xxh3_128_hexdigest(data),
    )
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # verified bytes that do not unpickle
        raise CheckpointError(f"checkpoint {shown}: {REST} verifies but does not load: {e}") from e
    if not isinstance(state, dict) or not isinstance(state.get("dcp"), dict):
        raise CheckpointError(f"checkpoint {shown}: {REST} is not a rankwise training state.")
    check_position(name or folder.name, state, f"checkpoint {shown}", f"its {REST}")
    index = manifest["files"][METADATA]
    state["dcp"] = {
        **state["dcp"],
        "folder": str(folder),
        "shown": shown,
        "metadata": {"size": int(index["size"]), "xxh3_128": str(index["xxh3_128"])},
        "downloaded": False,
    }
    return state


def load_shards(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, state: dict[str, Any]
) -> None:
    """Read the shards of :func:`read_state`'s folder into ``model`` (and ``optimizer``) as
    this world lays them out; a collective. DCP reshards: the folder may come from any world
    size, and loads into a plain model in a world of one. The ``.metadata`` DCP unpickles is
    read once and checked against what :func:`read_state` verified: DCP gets those bytes,
    not the file again (a state without that record is refused)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    info, view = state["dcp"], dcp_view(model)
    with_optimizer = bool(info["optimizer"])
    target: dict[str, Any] = {"model": get_model_state_dict(view)}
    if optimizer is not None and with_optimizer:
        # DCP creates the state it fills (a zero step); every entry is overwritten below.
        target["optimizer"] = get_optimizer_state_dict(view, optimizer)["state"]
    try:
        reader = _verified_reader(info)  # checked here, before DCP opens anything
        dcp.load(target, storage_reader=reader, checkpoint_id=info["folder"], no_dist=_no_dist())
    finally:
        if info.get("downloaded"):  # a bucket's folder, fetched for this load only
            shutil.rmtree(info["folder"], ignore_errors=True)
    set_model_state_dict(view, target["model"])
    if optimizer is None:
        return
    if with_optimizer:
        groups = state["optimizer"]["param_groups"]
        loaded = {"state": target["optimizer"], "param_groups": groups}
        set_optimizer_state_dict(view, optimizer, loaded)
    else:  # saved before its first step: hyper-parameters alone
        load_optimizer_state_dict(model, optimizer, state["optimizer"])


def _verified_reader(info: dict[str, Any]) -> Any:
    """A DCP reader of ``info["folder"]`` whose ``.metadata`` is the bytes checked here
    against ``info["metadata"]`` (the manifest's entry :func:`read_state` verified), read
    once: a file swapped after the check is never what DCP unpickles."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    shown = str(info.get("shown") or info["folder"])
    expected = info.get("metadata")
    if not isinstance(expected, dict):
        raise CheckpointError(
            f"checkpoint {shown}: the state names no verified {METADATA}; load it with "
            "rankwise.train.checkpoint.read_checkpoint, which verifies the folder first."
        )
    data = (Path(info["folder"]) / METADATA).read_bytes()
    check_content(
        f"checkpoint {shown}: {METADATA}",
        int(expected["size"]),
        str(expected["xxh3_128"]),
        "xxh3_128",
        len(data),
        lambda: xxhash.xxh3_128_hexdigest(data),
    )

    class VerifiedReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("rank") is not None:  # DCP's per-rank fallback: never written here
                raise CheckpointError(f"checkpoint {shown}: DCP asked for a per-rank index.")
            metadata = pickle.loads(data)  # verified above (with a key: signed)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return VerifiedReader(info["folder"])
