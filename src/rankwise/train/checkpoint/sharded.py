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
collectives on the default group. The folder is written under a temporary name; once every
rank's shards are on disk rank 0 writes ``train_state.pt`` and the manifest, renames the
folder into place and fsyncs, then the manager moves its pointer and prunes. The rules are a
checkpoint file's: a folder without a manifest that matches is never loaded, and
:meth:`CheckpointManager.latest` falls back past it.

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
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import xxhash
from torch import nn

import rankwise.distributed as rd
from rankwise.storage.local import fsync_dir, remove_tree, tmp_name, write_atomic
from rankwise.train.checkpoint.errors import CheckpointError
from rankwise.train.checkpoint.faults import fault_point
from rankwise.train.checkpoint.files import check_plain, write_json_atomic
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


class ShardedWriter:
    """Every rank's side of sharded saves for one :class:`CheckpointManager`: it keeps the
    staging buffers (reused from save to save) and the background process group."""

    def __init__(self) -> None:
        self._group: dist.ProcessGroup | None = None
        self._stager: Any = None

    def start(
        self, state: dict[str, Any], final: Path, *, background: bool, tmp: Path | None = None
    ) -> tuple[Path, concurrent.futures.Future[Any], dict[str, Any] | None]:
        """Begin writing ``state`` towards ``final``; a collective on every rank.

        Returns the temporary folder, this rank's write (a future: in the background it is
        done once the shards are on disk, on every rank once every rank's are: DCP's last
        step gathers them and rank 0 writes ``.metadata``) and, on rank 0, a copy of the plain
        rest that :func:`publish` writes. ``tmp``: this rank's own (local) folder to write to,
        instead of one beside ``final`` that rank 0 names for all (object storage uploads each
        rank's files from its own folder).
        """
        import torch.distributed.checkpoint as dcp

        tensors, rest = _split(state)
        check_plain(rest, "state")  # here, not as an error on the background thread
        tmp = _shared_tmp(final) if tmp is None else tmp
        storage = dcp.FileSystemWriter(str(tmp))
        no_dist = _no_dist()
        written: concurrent.futures.Future[Any]
        if background:
            response = dcp.async_save(
                tensors,
                storage_writer=storage,
                process_group=self.background_group(),
                async_stager=self._staging(),
                no_dist=no_dist,
            )
            # A plain future of the upload (staging was synchronous); a newer DCP may answer
            # with a response holding it.
            written = getattr(response, "upload_completion", response)  # type: ignore[arg-type]
        else:
            written = concurrent.futures.Future()
            written.set_result(dcp.save(tensors, storage_writer=storage, no_dist=no_dist))
        return tmp, written, snapshot(rest) if rd.is_master() else None

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


def _shared_tmp(final: Path) -> Path:
    """A fresh temporary folder beside ``final``, named by rank 0 and known to every rank."""
    tmp: Path | None = None
    if rd.is_master():
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_name(final)
        tmp.mkdir()
    if in_group():
        tmp = Path(rd.broadcast_plain(None if tmp is None else str(tmp)))
    assert tmp is not None  # rank 0 made it; the others received it
    return tmp


def publish(
    tmp: Path,
    final: Path,
    rest: dict[str, Any],
    meta: dict[str, Any],
    key: str | bytes | None = None,
) -> None:
    """Rank 0, once every rank's shards are in ``tmp``: the rest, the manifest (last; signed
    under ``key``, see ``manifests.resolve_key``), then ``tmp`` renamed to ``final`` and the
    parent folder fsynced."""
    write_atomic(tmp / REST, lambda f: torch.save(rest, f))
    fault_point("before-manifest")
    manifest = sign(new_manifest(file_entries(tmp), meta), final.name, key)
    write_json_atomic(tmp / MANIFEST, manifest)
    fault_point("before-rename")
    if final.exists():  # the same step saved again: the old folder goes first (a kill in
        remove_tree(final)  # between leaves neither, and the previous checkpoint is used)
    os.replace(tmp, final)
    fsync_dir(final.parent)


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
