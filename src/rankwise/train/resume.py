"""What a trainer checkpoint holds, and how a run picks one up again (possibly on R' ranks).

Content (``trainer_api.md``): model and optimizer state with wrapping-independent keys,
scheduler, precision (GradScaler), the sampler's cursor, epoch and optimizer step, RNG states,
config, world size, global batch size, history — plus ``"trainer"``: the world's metric sums
of the epoch so far (so a mid-epoch resume reports the same epoch loss), whether the learning
rate was already scaled, the compression hook's state and every rank's RNG.

``"epoch"`` is the epoch to run next: after a mid-epoch save it is the current epoch (the
sampler's cursor says how far it got), after an end-of-epoch save the following one.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

import rankwise.distributed as rd
from rankwise.parallel import comm_state_dict, load_comm_state_dict
from rankwise.train import checkpoint as ck
from rankwise.train.history import DistributedTrainingHistory
from rankwise.train.loop import EpochSums

if TYPE_CHECKING:
    from rankwise.train.config import DistributedTrainingConfig
    from rankwise.train.trainer import DistributedTrainer


@dataclass
class Position:
    """Where a run stands: the epoch to run, optimizer steps so far, the epoch's sums."""

    epoch: int = 0
    step: int = 0
    carried: list[float] | None = None
    history: DistributedTrainingHistory | None = None
    sampler: dict[str, Any] | None = None
    precision: dict[str, Any] | None = None  # applied once fit() has built the Precision
    global_batch: int | None = None  # the saved run's; checked against each fit's config
    mid_epoch: bool = False  # saved inside an epoch: only a saved sampler cursor continues it


def build_state(trainer: DistributedTrainer, epoch: int, sums: EpochSums | None) -> dict[str, Any]:
    """The checkpoint dict; collective (every rank calls it, rank 0's copy is written)."""
    model, optimizer, cfg = trainer.model, trainer.optimizer, trainer.config
    assert optimizer is not None and cfg is not None, "set up by fit()"
    world = rd.get_world_size()
    carried = sums.reduced().tolist() if sums is not None else [0.0] * 4
    rngs: list[Any] = [ck.rng_state()]
    if world > 1 and rd.has_group():
        rngs = [None] * world
        dist.all_gather_object(rngs, ck.rng_state())
    source = trainer.train_source
    sampler = getattr(source, "sampler", None)
    return {
        "format": ck.FORMAT_VERSION,
        "model": ck.model_state_dict(model),
        "optimizer": ck.optimizer_state_dict(model, optimizer),
        "scheduler": None if trainer.scheduler is None else trainer.scheduler.state_dict(),
        "precision": trainer.precision.state_dict(),
        "sampler": None if sampler is None else sampler.state_dict(),
        "epoch": epoch,
        "step": trainer.global_step,
        "rng": rngs[0],
        "config": cfg.to_dict(),
        "world_size": world,
        "global_batch_size": cfg.effective_batch_size(world),
        "history": trainer.history.to_dict(),
        "trainer": {
            "epoch_sums": carried,
            "lr_scaled": trainer.lr_scaled,
            "comm": comm_state_dict(model),
            "rng_per_rank": rngs,
        },
    }


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


def apply_state(trainer: DistributedTrainer, state: dict[str, Any], path: Path | str) -> Position:
    """Load ``state`` into the trainer's model, optimizer, scheduler and precision; collective.
    Returns the position (the sampler state is applied by the caller, who owns the data)."""
    version = state.get("format")
    if version != ck.FORMAT_VERSION:
        raise ck.CheckpointError(
            f"{path}: checkpoint format {version!r} is not {ck.FORMAT_VERSION}; it was written "
            "by another rankwise version or is not a trainer checkpoint. Load it with the "
            "rankwise version that wrote it, pass a checkpoint this trainer saved, or start "
            "fresh with resume=None."
        )
    world = rd.get_world_size()
    ck.load_model_state_dict(trainer.model, state["model"])
    # Before the first fit() an optimizer given as a factory does not exist yet: the next
    # fit builds it fresh (the model weights are what a loaded checkpoint is mostly for).
    if trainer.optimizer is not None:
        ck.load_optimizer_state_dict(trainer.model, trainer.optimizer, state["optimizer"])
    if trainer.scheduler is not None and state.get("scheduler") is not None:
        trainer.scheduler.load_state_dict(state["scheduler"])
    if trainer.prepared is not None:
        trainer.precision.load_state_dict(state["precision"])
    extra = state.get("trainer", {})
    if extra.get("comm"):
        load_comm_state_dict(trainer.model, extra["comm"])
    trainer.lr_scaled = bool(extra.get("lr_scaled", False))
    rngs = extra.get("rng_per_rank") or [state["rng"]]
    # Each rank continues its own random stream when the world is the same; otherwise every
    # rank takes rank 0's (there is no right answer for a rank that did not exist).
    ck.set_rng_state(rngs[rd.get_rank()] if len(rngs) == world else state["rng"])
    carried = extra.get("epoch_sums")
    return Position(
        global_batch=int(state["global_batch_size"]),
        # the same on every rank: the world's sums of the epoch so far, in the file
        mid_epoch=bool(carried) and float(carried[1]) > 0,
        epoch=int(state["epoch"]),
        step=int(state["step"]),
        carried=carried if rd.is_master() else None,
        history=DistributedTrainingHistory.from_dict(state["history"]),
        sampler=state.get("sampler"),
        precision=None if trainer.prepared is not None else state["precision"],
    )


def continue_data(position: Position, cfg: DistributedTrainingConfig, sampler: Any) -> None:
    """Check that ``position`` can continue under ``cfg`` on this world, then move the
    sampler to where the run stopped (the rest of the epoch re-split over this world size).

    Runs for a resume and after ``load_checkpoint()`` before ``fit()`` alike.
    """
    if position.global_batch is not None:
        check_global_batch(
            position.global_batch, cfg.batch_size, rd.get_world_size(), cfg.grad_accum_steps
        )
    check_resumable(position, sampler)
    saved = position.sampler
    if sampler is not None and saved is not None and saved["epoch"] == position.epoch:
        sampler.load_state_dict(saved)


def check_resumable(position: Position, sampler: Any) -> None:
    """Refuse a mid-epoch resume that cannot continue where the run stopped: without a saved
    rankwise sampler cursor the loader would repeat the epoch from its start (its first part
    trained, and counted, twice)."""
    if not position.mid_epoch or (sampler is not None and position.sampler is not None):
        return
    missing = "this run's" if sampler is None else "the checkpoint's"
    raise ValueError(
        f"cannot resume mid-epoch (epoch {position.epoch}, optimizer step {position.step}): "
        f"{missing} training data has no rankwise DistributedSampler, so the rest of the epoch "
        "is unknown and the loader would repeat it from the start. Put "
        "rankwise.data.DistributedSampler in your DataLoader (or pass the Dataset and let the "
        "trainer build the loader), or resume from an epoch-end checkpoint "
        "(checkpoint_every_n_steps=0)."
    )


def manager_for(cfg: DistributedTrainingConfig) -> ck.CheckpointManager | None:
    """The checkpoint folder's manager (one folder per rank unless rank 0 alone saves)."""
    if cfg.checkpoint_dir is None:
        return None
    base = Path(cfg.checkpoint_dir)
    folder = base if cfg.save_on_master_only else base / f"rank-{rd.get_rank()}"
    return ck.CheckpointManager(folder, keep_last=cfg.keep_last_checkpoints)


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
    if resume is None:
        return None
    found: tuple[Path, dict[str, Any]] | None = None
    error: str | None = None
    try:
        if resume != "auto":
            found = Path(resume), ck.load_file(resume)
        elif per_rank or rd.is_master():
            found = manager.load_latest() if manager is not None else None
    except Exception as e:  # any failure must reach every rank, below
        error = f"{type(e).__name__}: {e}"
    if resume == "auto" and not per_rank:
        path = _broadcast_path(found[0] if found is not None else None)
        if path is not None and not rd.is_master():
            try:
                found = path, ck.load_file(path)
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
