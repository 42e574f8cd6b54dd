"""Picking a run up again from its checkpoints (possibly on R' ranks).

What a checkpoint holds is the training state's ``state_dict()``
(:class:`~rankwise.train.TrainState`). :func:`load_resume` finds the checkpoint to resume from (rank 0's choice,
verified, agreed by every rank). Moving the data to where the run stopped is the training
state's own step (``TrainState.resume_data``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import rankwise.distributed as rd
from rankwise.storage import is_remote_url
from rankwise.train.checkpoint.errors import CheckpointError
from rankwise.train.checkpoint.manager import (
    CheckpointManager,
    RemoteCheckpointManager,
    read_checkpoint,
)

# Where a checkpoint is: a local path, or an object's URL (a str: Path("s3://b") is "s3:/b").
Location = Path | str
Manager = CheckpointManager | RemoteCheckpointManager


def load_resume(
    resume: str | None,
    manager: Manager | None,
    per_rank: bool,
    storage_options: dict[str, Any] | None = None,
    key: str | None = None,
    roles: rd.Roles | None = None,
) -> tuple[Location, dict[str, Any]] | None:
    """``(path, state)`` to resume from, or None for a fresh start; collective.

    ``key``: the checkpoint key a ``resume`` path is checked with (default:
    ``RANKWISE_CHECKPOINT_KEY``); ``resume="auto"`` uses the manager's.

    ``per_rank`` (``save_on_master_only=False``): each rank takes the newest valid copy in its
    own folder. Otherwise rank 0 picks the newest valid checkpoint (verified once) and the
    others read the file it names. Every rank's failure becomes an error on every rank, and
    ranks that found different ``(epoch, step)`` are refused: no rank goes on into the
    collectives of a resume the others cannot do. ``roles``: this process's
    (:class:`rankwise.distributed.Roles`; default: built here): a restarted process under
    ``--on-failure continue`` resumes nothing (a live peer sends it the state).
    """
    roles = rd.Roles.for_this_process() if roles is None else roles
    if resume is None or roles.joining:
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
                assert manager is not None  # rank 0 found the path with it
                found = path, manager.read(path, shards=False)
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
