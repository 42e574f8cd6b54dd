"""Resumes the trainer must refuse rather than get wrong: mid-epoch without a rankwise
sampler cursor, a global batch the world cannot split after load_checkpoint() before fit(),
and per-rank checkpoints (save_on_master_only=False) that are missing or disagree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import rankwise.distributed as rd
from rankwise.data import DistributedSampler
from rankwise.testing import run_distributed
from rankwise.train import DistributedTrainer, DistributedTrainingConfig


class Stop(Exception):
    pass


def _trainer(stop_at: int | None = None) -> DistributedTrainer:
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters()))
    if stop_at is not None:

        def stop(_t: Any, _e: int, step: int, _ids: Any) -> None:
            if step == stop_at:
                raise Stop

        trainer.on_batch = stop
    return trainer


def _dataset(n: int = 48) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g))


def _cfg(folder: Path | str | None, **fields: Any) -> DistributedTrainingConfig:
    fields.setdefault("epochs", 1)
    fields.setdefault("batch_size", 16)
    fields.setdefault("checkpoint_dir", None if folder is None else str(folder))
    return DistributedTrainingConfig(verbose=False, **fields)


# -- item: a mid-epoch resume with the user's own DataLoader ---------------------------------


def _stopped_mid_epoch(folder: Path, loader: DataLoader[Any]) -> None:
    # 48 samples x 16: 3 steps; a checkpoint at step 2 (mid-epoch), stopped in step 3.
    with pytest.raises(Stop):
        _trainer(stop_at=2).fit(loader, config=_cfg(folder, checkpoint_every_n_steps=2))


def test_a_mid_epoch_resume_without_a_rankwise_sampler_is_refused(tmp_path: Path) -> None:
    loader = DataLoader(_dataset(), batch_size=16)  # torch's SequentialSampler: no cursor
    _stopped_mid_epoch(tmp_path, loader)
    with pytest.raises(ValueError, match=r"cannot resume mid-epoch \(epoch 0, optimizer step 2\)"):
        _trainer().fit(loader, config=_cfg(tmp_path, resume="auto"))


def test_a_mid_epoch_resume_with_a_rankwise_sampler_in_the_loader_goes_on(
    tmp_path: Path,
) -> None:
    def loader() -> DataLoader[Any]:
        return DataLoader(_dataset(), batch_size=16, sampler=DistributedSampler(48, seed=0))

    _stopped_mid_epoch(tmp_path, loader())
    trainer = _trainer()
    trainer.fit(loader(), config=_cfg(tmp_path, resume="auto"))
    assert trainer.global_step == 3  # the one step left, not the epoch again


# -- item: load_checkpoint() before the first fit() ------------------------------------------


def test_load_checkpoint_before_fit_still_checks_the_global_batch(tmp_path: Path) -> None:
    first = _trainer()
    first.fit(_dataset(), config=_cfg(None))
    path = first.save_checkpoint(tmp_path / "saved.pt")  # global batch 16
    again = _trainer()
    again.load_checkpoint(path)
    with pytest.raises(ValueError, match=r"saved global batch 16 cannot be split over 1 ranks x 3"):
        again.fit(_dataset(), config=_cfg(tmp_path, batch_size=5, grad_accum_steps=3))
