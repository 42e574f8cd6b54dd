"""Resumes the trainer must refuse rather than get wrong: mid-epoch without a rankwise
sampler cursor, a global batch the world cannot split after load_checkpoint() before fit(),
and per-rank checkpoints (save_on_master_only=False) that are missing or disagree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader, TensorDataset

import rankwise.distributed as rd
from helpers.trainer_stops import Stop, stop_in_step
from helpers.training import classification, make_trainer, mlp
from rankwise.data import DistributedSampler
from rankwise.testing import run_distributed
from rankwise.train import DistributedTrainingConfig

DATASET = TensorDataset(*classification(48, 8, 3, seed=1))


def _cfg(folder: Path | str | None, **fields: Any) -> DistributedTrainingConfig:
    fields.setdefault("epochs", 1)
    fields.setdefault("batch_size", 16)
    fields.setdefault("checkpoint_dir", None if folder is None else str(folder))
    return DistributedTrainingConfig(verbose=False, **fields)


# -- item: a mid-epoch resume with the user's own DataLoader ---------------------------------


def _stopped_mid_epoch(folder: Path, loader: DataLoader[Any]) -> None:
    # 48 samples x 16: 3 steps; a checkpoint at step 2 (mid-epoch), stopped in step 3.
    trainer = make_trainer(mlp(8, 3))
    stop_in_step(trainer, 2)
    with pytest.raises(Stop):
        trainer.fit(loader, config=_cfg(folder, checkpoint_every_n_steps=2))


def test_a_mid_epoch_resume_without_a_rankwise_sampler_is_refused(tmp_path: Path) -> None:
    loader = DataLoader(DATASET, batch_size=16)  # torch's SequentialSampler: no cursor
    _stopped_mid_epoch(tmp_path, loader)
    with pytest.raises(ValueError, match=r"cannot resume mid-epoch \(epoch 0, optimizer step 2\)"):
        make_trainer(mlp(8, 3)).fit(loader, config=_cfg(tmp_path, resume="auto"))


def test_a_mid_epoch_resume_with_a_rankwise_sampler_in_the_loader_goes_on(
    tmp_path: Path,
) -> None:
    def loader() -> DataLoader[Any]:
        return DataLoader(
            DATASET,
            batch_size=16,
            sampler=DistributedSampler(48, seed=0),
        )

    _stopped_mid_epoch(tmp_path, loader())
    trainer = make_trainer(mlp(8, 3))
    trainer.fit(loader(), config=_cfg(tmp_path, resume="auto"))
    assert trainer.global_step == 3  # the one step left, not the epoch again


# -- item: load_checkpoint() before the first fit() ------------------------------------------


def test_load_checkpoint_before_fit_still_checks_the_global_batch(tmp_path: Path) -> None:
    first = make_trainer(mlp(8, 3))
    first.fit(DATASET, config=_cfg(None))
    path = first.save_checkpoint(tmp_path / "saved.pt")  # global batch 16
    again = make_trainer(mlp(8, 3))
    again.load_checkpoint(path)
    with pytest.raises(ValueError, match=r"saved global batch 16 cannot be split over 1 ranks x 3"):
        again.fit(
            DATASET,
            config=_cfg(tmp_path, batch_size=5, grad_accum_steps=3),
        )


# -- item: per-rank copies (save_on_master_only=False) ---------------------------------------


def _resume(folder: str, resume: str) -> str:
    cfg = _cfg(folder, save_on_master_only=False, resume=resume, epochs=2)
    trainer = make_trainer(mlp(8, 3))
    try:
        trainer.fit(DATASET, config=cfg)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return f"resumed, step {trainer.global_step}"


def _per_rank(tmp: str) -> dict[str, str]:
    rank = rd.get_rank()
    # 48 samples, 2 ranks x 16: 2 steps an epoch (the last one short); saves at steps 1, 2.
    make_trainer(mlp(8, 3)).fit(
        DATASET,
        config=_cfg(tmp, save_on_master_only=False, checkpoint_every_n_steps=1),
    )
    own = Path(tmp, f"rank-{rank}")
    out = {"whole": _resume(tmp, "auto")}  # epoch 1 (steps 3, 4) from own copies
    newest = sorted(own.glob("*.pt"))[-1]
    missing = own / "missing.pt"
    # An explicit path that only rank 0 can read: both ranks must raise, none may hang.
    out["explicit"] = _resume(tmp, str(newest if rank == 0 else missing))
    rd.barrier()
    if rank == 1:  # rank 1's newest copy lost: the ranks' newest checkpoints differ
        for extra in own.glob(newest.name + "*"):
            extra.unlink()
        (own / "ckpt-latest.json").unlink()
    rd.barrier()
    out["differ"] = _resume(tmp, "auto")
    return out


@pytest.mark.timeout(200)
def test_per_rank_copies_are_each_ranks_own_and_every_failure_stops_every_rank(
    tmp_path: Path,
) -> None:
    for result in run_distributed(_per_rank, 2, args=(str(tmp_path),), timeout=120):
        assert result["whole"] == "resumed, step 4"
        assert result["explicit"].startswith("CheckpointError: cannot resume: rank 1: ")
        assert "missing.pt" in result["explicit"]
        assert "rank 0: epoch 2 step 4, rank 1: epoch 1 step 2" in result["differ"], result[
            "differ"
        ]
