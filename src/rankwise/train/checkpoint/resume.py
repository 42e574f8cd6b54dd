"""Picking a run up again from its checkpoints (possibly on R' ranks).

What a checkpoint holds is the training state's ``state_dict()``
(:class:`~rankwise.train.TrainState`). :func:`manager_for` is the folder ``fit`` saves to and
resumes from; :func:`load_resume` finds the checkpoint to resume from (rank 0's choice,
verified, agreed by every rank). Moving the data to where the run stopped is the training
state's own step (``TrainState.resume_data``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import rankwise.distributed as rd
from rankwise.storage import Storage, is_remote_url
from rankwise.train.checkpoint.errors import CheckpointError
from rankwise.train.checkpoint.manager import (
    CheckpointManager,
    RemoteCheckpointManager,
    read_checkpoint,
)
from rankwise.train.config import DistributedTrainingConfig

# Where a checkpoint is: a local path, or an object's URL (a str: Path("s3://b") is "s3:/b").
Location = Path | str
Manager = CheckpointManager | RemoteCheckpointManager


def manager_for(cfg: DistributedTrainingConfig) -> Manager | None:
    """The checkpoint folder's manager (one folder per rank unless rank 0 alone saves);
    under ``strategy="fsdp"`` it writes sharded DCP folders, every rank its shards (to a
    local folder or a bucket). Per-rank
    folders are a process's own: by slot under ``--on-failure continue`` (a restarted slot 2
    writes ``rank-2/`` again, not ``rank-0/`` of its world of one). A relative folder is
    refused for a continue job on more than one node (rank 0 moves between nodes: the folder
    must be shared).

    An object-storage URL gives a :class:`RemoteCheckpointManager`, checked here on every rank
    (reachable, writable: a :class:`~rankwise.train.checkpoint.StorageError` naming the URL
    and the fix before the first step), and its writer's stale multipart uploads aborted."""
    if cfg.checkpoint_dir is None:
        return None
    member = rd.membership()
    who = member.cfg.slot if member is not None else rd.get_rank()
    per_rank = "" if cfg.save_on_master_only else f"rank-{who}"
    keep = cfg.keep_last_checkpoints
    sharded = cfg.strategy == "fsdp"
    if is_remote_url(cfg.checkpoint_dir):
        url = cfg.checkpoint_dir.rstrip("/") + (f"/{per_rank}" if per_rank else "")
        storage = Storage.for_url(url, cfg.checkpoint_storage_options)
        manager = RemoteCheckpointManager(
            storage, keep_last=keep, sharded=sharded, key=cfg.checkpoint_key
        )
        if per_rank or rd.is_master():  # the writer cleans its own URL
            manager.start()
        else:
            storage.check_writable()
        return manager
    base = Path(cfg.checkpoint_dir)
    if member is not None and member.cfg.nnodes > 1 and not base.is_absolute():
        raise ValueError(
            f"checkpoint_dir ({cfg.checkpoint_dir!r}) is relative, and this --on-failure "
            f"continue job runs on {member.cfg.nnodes} nodes: whoever is rank 0 writes each "
            "save, on whatever node it runs, so the saves would scatter over the nodes' own "
            "folders. Give an absolute path on storage every node shares (e.g. "
            "'/shared/run1/ckpt')."
        )
    folder = base / per_rank if per_rank else base
    return CheckpointManager(folder, keep_last=keep, sharded=sharded, key=cfg.checkpoint_key)


def load_resume(
    resume: str | None,
    manager: Manager | None,
    per_rank: bool,
    storage_options: dict[str, Any] | None = None,
    key: str | None = None,
) -> tuple[Location, dict[str, Any]] | None:
    """``(path, state)`` to resume from, or None for a fresh start; collective.

    ``key``: the checkpoint key a ``resume`` path is checked with (default:
    ``RANKWISE_CHECKPOINT_KEY``); ``resume="auto"`` uses the manager's.

    ``per_rank`` (``save_on_master_only=False``): each rank takes the newest valid copy in its
    own folder. Otherwise rank 0 picks the newest valid checkpoint (verified once) and the
    others read the file it names. Every rank's failure becomes an error on every rank, and
    ranks that found different ``(epoch, step)`` are refused: no rank goes on into the
    collectives of a resume the others cannot do.
    """
    member = rd.membership()
    if resume is None or (member is not None and member.pending):
        return None  # a restarted process under --on-failure continue: a peer's state
    found: tuple[Location, dict[str, Any]] | None = None
    error: str | None = None
    try:
        if resume != "auto":  # a sharded folder's shards: checked in full by rank 0 alone
            state = read_checkpoint(
                resume, verify_shards=rd.is_master(), storage_options=storage_options, key=key
            )
            found = location(resume), state
        elif per_rank or rd.is_master():
            found = manager.load_latest() if manager is not None else None
    except Exception as e:  # any failure must reach every rank, below
        error = f"{type(e).__name__}: {e}"
    if resume == "auto" and not per_rank:
        path = broadcast_path(found[0] if found is not None else None)
        if path is not None and not rd.is_master():
            try:  # rank 0 verified it in full
                if isinstance(manager, RemoteCheckpointManager):
                    found = path, manager.read(str(path))
                else:
                    found = path, read_checkpoint(path, verify_shards=False, key=key)
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
    _agree(found, error)
    return found


def _agree(found: tuple[Location, dict[str, Any]] | None, error: str | None) -> None:
    mine = (error, None if found is None else (int(found[1]["epoch"]), int(found[1]["step"])))
    everyone: list[Any] = rd.all_gather_plain(mine)  # data, never a peer's pickle
    # rstrip: each error ends in a full stop, and the list is followed by one.
    failed = [f"rank {r}: {e.rstrip('.')}" for r, (e, _) in enumerate(everyone) if e is not None]
    if failed:
        raise CheckpointError(
            "cannot resume: " + "; ".join(failed) + ". Every rank needs a readable checkpoint "
            "(a shared checkpoint_dir, or each rank's own copy with save_on_master_only=False); "
            "fix or remove the named files, or start fresh with resume=None."
        )
    positions = [p for _, p in everyone]
    if len(set(positions)) > 1:
        listed = ", ".join(
            f"rank {r}: " + ("none" if p is None else f"epoch {p[0]} step {p[1]}")
            for r, p in enumerate(positions)
        )
        raise CheckpointError(
            f"cannot resume: the ranks' newest valid checkpoints differ ({listed}); every "
            "rank must resume from the same step. Remove the newer copies so every rank's "
            "checkpoint_dir/rank-<r> holds the same newest step, or start fresh with resume=None."
        )


def location(path: str | Path) -> Location:
    """``path`` as a checkpoint's location: an object-storage URL stays a ``str``.

    >>> location("s3://bucket/run/ckpt.pt"), location("run/ckpt.pt")
    ('s3://bucket/run/ckpt.pt', PosixPath('run/ckpt.pt'))
    """
    text = str(path)
    return text if is_remote_url(text) else Path(text)


def broadcast_path(path: Location | None) -> Location | None:
    """Rank 0's ``path`` on every rank (the writing rank names the file; the others need it
    too); a collective in a world of more than one."""
    if rd.get_world_size() == 1 or not rd.has_group():
        return path
    sent = rd.broadcast_plain(None if path is None else str(path))  # never a peer's pickle
    return None if sent is None else location(sent)
