"""Picking a run up again from its checkpoints (possibly on R' ranks).

What a checkpoint holds is :class:`~rankwise.train.state.TrainState`'s ``state_dict()``. This
module finds the one to resume from (:func:`load_resume`: rank 0's choice, verified, agreed by
every rank), and checks that the data can continue where the run stopped
(:func:`continue_data`: the global batch this world can reproduce, a saved cursor for a
mid-epoch resume) before moving the sampler there.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch.distributed as dist

import rankwise.distributed as rd
from rankwise.train import checkpoint as ck
from rankwise.train.config import DistributedTrainingConfig
from rankwise.train.state import Restored, TrainState


def check_global_batch(saved: int, batch_size: int, world: int, accum: int) -> None:
    """Refuse a resume whose saved global batch this world cannot reproduce; warn when the
    user changed it (the run then differs from an uninterrupted one)."""
    now = batch_size * world * accum
    if saved == now:
        return
    if saved % (world * accum):
        raise ValueError(
            f"saved global batch {saved} cannot be split over {world} ranks x {accum} "
            f"accumulation steps; use batch_size such that batch_size x world_size x "
            f"grad_accum_steps = {saved} (a world size and grad_accum_steps whose product "
            f"divides {saved}), or start a fresh run with resume=None."
        )
    warnings.warn(
        f"the checkpoint was saved with global batch {saved} and this run's is {now} "
        f"(batch_size {batch_size} x {world} ranks x {accum}); training goes on with {now}. "
        f"Set batch_size={saved // (world * accum)} to continue exactly as the saved run.",
        stacklevel=4,
    )


def continue_data(state: TrainState, cfg: DistributedTrainingConfig) -> None:
    """Check that the restored ``state`` can continue under ``cfg`` on this world, then move
    its sampler to where the run stopped (the rest of the epoch re-split over this world size).

    Runs for a resume and after ``load_checkpoint()`` before ``fit()`` alike.
    """
    restored = state.restored
    if restored is None:
        return
    check_global_batch(
        restored.global_batch, cfg.batch_size, rd.get_world_size(), cfg.grad_accum_steps
    )
    check_resumable(state, restored)
    saved = restored.cursor
    if state.sampler is not None and saved is not None and saved["epoch"] == state.epoch:
        state.sampler.load_state_dict(saved)


def check_resumable(state: TrainState, restored: Restored) -> None:
    """Refuse a mid-epoch resume that cannot continue where the run stopped: without a saved
    rankwise sampler cursor the loader would repeat the epoch from its start (its first part
    trained, and counted, twice)."""
    sampler = state.sampler
    if not restored.mid_epoch or (sampler is not None and restored.cursor is not None):
        return
    missing = "this run's" if sampler is None else "the checkpoint's"
    raise ValueError(
        f"cannot resume mid-epoch (epoch {state.epoch}, optimizer step {state.step}): "
        f"{missing} training data has no rankwise DistributedSampler, so the rest of the epoch "
        "is unknown and the loader would repeat it from the start. Put "
        "rankwise.data.DistributedSampler in your DataLoader (or pass the Dataset and let the "
        "trainer build the loader), or resume from an epoch-end checkpoint "
        "(checkpoint_every_n_steps=0)."
    )


def manager_for(cfg: DistributedTrainingConfig) -> ck.CheckpointManager | None:
    """The checkpoint folder's manager (one folder per rank unless rank 0 alone saves);
    under ``strategy="fsdp"`` it writes sharded DCP folders, every rank its shards."""
    if cfg.checkpoint_dir is None:
        return None
    base = Path(cfg.checkpoint_dir)
    folder = base if cfg.save_on_master_only else base / f"rank-{rd.get_rank()}"
    sharded = cfg.strategy == "fsdp"
    return ck.CheckpointManager(folder, keep_last=cfg.keep_last_checkpoints, sharded=sharded)


def load_resume(
    resume: str | None, manager: ck.CheckpointManager | None, per_rank: bool
) -> tuple[Path, dict[str, Any]] | None:
    """``(path, state)`` to resume from, or None for a fresh start; collective.

    ``per_rank`` (``save_on_master_only=False``): each rank takes the newest valid copy in its
    own folder. Otherwise rank 0 picks the newest valid checkpoint (verified once) and the
    others read the file it names. Every rank's failure becomes an error on every rank, and
    ranks that found different ``(epoch, step)`` are refused: no rank goes on into the
    collectives of a resume the others cannot do.
    """
    member = rd.membership()
    if resume is None or (member is not None and member.pending):
        return None  # a restarted process under --on-failure continue: a peer's state
    found: tuple[Path, dict[str, Any]] | None = None
    error: str | None = None
    try:
        if resume != "auto":  # a sharded folder's shards: checked in full by rank 0 alone
            found = Path(resume), ck.read_checkpoint(resume, verify_shards=rd.is_master())
        elif per_rank or rd.is_master():
            found = manager.load_latest() if manager is not None else None
    except Exception as e:  # any failure must reach every rank, below
        error = f"{type(e).__name__}: {e}"
    if resume == "auto" and not per_rank:
        path = _broadcast_path(found[0] if found is not None else None)
        if path is not None and not rd.is_master():
            try:  # rank 0 verified it in full
                found = path, ck.read_checkpoint(path, verify_shards=False)
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
    _agree(found, error)
    return found


def _agree(found: tuple[Path, dict[str, Any]] | None, error: str | None) -> None:
    mine = (error, None if found is None else (int(found[1]["epoch"]), int(found[1]["step"])))
    everyone: list[Any] = [mine]
    if rd.get_world_size() > 1 and rd.has_group():
        everyone = [None] * rd.get_world_size()
        dist.all_gather_object(everyone, mine)
    # rstrip: each error ends in a full stop, and the list is followed by one.
    failed = [f"rank {r}: {e.rstrip('.')}" for r, (e, _) in enumerate(everyone) if e is not None]
    if failed:
        raise ck.CheckpointError(
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
        raise ck.CheckpointError(
            f"cannot resume: the ranks' newest valid checkpoints differ ({listed}); every "
            "rank must resume from the same step. Remove the newer copies so every rank's "
            "checkpoint_dir/rank-<r> holds the same newest step, or start fresh with resume=None."
        )


def _broadcast_path(path: Path | None) -> Path | None:
    if rd.get_world_size() == 1 or not rd.has_group():
        return path
    box: list[Any] = [None if path is None else str(path)]
    dist.broadcast_object_list(box, src=0)
    return None if box[0] is None else Path(box[0])


def share_path(path: Path | None) -> Path | None:
    """Rank 0's path on every rank (the writer names the file; the others need it too)."""
    return _broadcast_path(path)
