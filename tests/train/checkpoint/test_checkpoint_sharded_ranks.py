"""Sharded (FSDP2) checkpoints in a folder, on 2 ranks: a DCP folder per checkpoint that every
rank writes its shards to in the background, with the file checkpoints' manifest and pointer; a
resume on the same world ends bit-identical, on another world size within 1e-4. The one-process
rules (saves, loads, torn and unfinished folders) run on every backend in
``test_checkpoint_sharded.py``."""

from __future__ import annotations

import contextlib
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import rankwise.distributed as rd
from helpers.trainer_stops import Stop, fit_starts, stop_in_step
from helpers.training import ADAM, classification, make_trainer, mlp
from rankwise.testing import run_distributed
from rankwise.train import DistributedTrainingConfig
from rankwise.train import checkpoint as ck
from rankwise.train.checkpoint.sharded import MANIFEST, REST


def _run(folder: Path, batch_size: int, stop_at: int | None = None, resume: Any = None) -> Any:
    trainer = make_trainer(mlp(16, 32, 4, activation=nn.ReLU), ADAM)
    started = fit_starts(trainer)
    stop_in_step(trainer, stop_at)
    # 96 samples, a global batch of 16: 6 optimizer steps an epoch, a checkpoint every 4.
    cfg = DistributedTrainingConfig(
        epochs=2,
        batch_size=batch_size,
        verbose=False,
        strategy="fsdp",
        checkpoint_dir=str(folder),
        checkpoint_every_n_steps=4,
        checkpoint_every_n_epochs=0,
        keep_last_checkpoints=2,
        resume=resume,
    )
    with contextlib.suppress(Stop):
        trainer.fit(*classification(96, 16, 4, seed=7), cfg)
    full = ck.model_state_dict(trainer.model, all_ranks=True)  # gathered from the shards
    return {"params": full, "started_at": started[0], "stats": trainer.checkpoint_stats}


def _two_ranks(tmp: str) -> dict[str, Any]:
    full = _run(Path(tmp, "full"), 8)
    _run(Path(tmp, "cut"), 8, stop_at=9)  # in step 9: the newest checkpoint is step 8
    if rd.is_master():  # as the crash left it, for the resume on one rank
        shutil.copytree(Path(tmp, "cut"), Path(tmp, "cut-for-one"))
    rd.barrier()
    resumed = _run(Path(tmp, "cut"), 8, resume="auto")
    return {
        "full": full["params"],
        "resumed": resumed["params"],
        "started_at": resumed["started_at"],
        "saves": full["stats"].saves,
    }


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("sharded")
    results = run_distributed(_two_ranks, 2, args=(str(folder),), timeout=240)
    assert results[0]["full"].keys() == results[1]["full"].keys()
    return folder, results[0]


@pytest.mark.timeout(300)
def test_a_fsdp_checkpoint_is_a_dcp_folder_with_a_manifest(
    two_ranks: tuple[Path, dict[str, Any]],
) -> None:
    folder, result = two_ranks
    full = folder / "full"
    assert result["saves"] == 3  # steps 4 and 8, and the end of fit at step 12
    names = sorted(p.name for p in full.iterdir())
    # keep_last=2 pruned step 4's folder; nothing temporary is left behind
    assert names == [
        "ckpt-e000001-s000000008.dcp",
        "ckpt-e000002-s000000012.dcp",
        "ckpt-latest.json",
    ]
    newest = full / "ckpt-e000002-s000000012.dcp"
    assert json.loads((full / "ckpt-latest.json").read_text())["file"] == newest.name
    files = sorted(p.name for p in newest.iterdir())
    assert files == sorted([".metadata", "__0_0.distcp", "__1_0.distcp", REST, MANIFEST])
    manifest = json.loads((newest / MANIFEST).read_text())
    assert sorted(manifest["files"]) == sorted(set(files) - {MANIFEST})
    assert manifest["meta"] == {"epoch": 2, "step": 12, "world_size": 2}
    assert ck.CheckpointManager(full).latest() == newest


@pytest.mark.timeout(300)
def test_resume_on_the_same_world_is_bit_identical(
    two_ranks: tuple[Path, dict[str, Any]],
) -> None:
    _, result = two_ranks
    assert result["started_at"] == 8  # mid-epoch 1, from the sharded folder of step 8
    for name, value in result["full"].items():
        assert torch.equal(value, result["resumed"][name]), name


@pytest.mark.timeout(300)
def test_resume_on_one_rank_matches_within_1e_4(two_ranks: tuple[Path, dict[str, Any]]) -> None:
    folder, result = two_ranks
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="strategy='fsdp' in a world of one")
        # A world of one: a plain model, the same global batch of 16.
        one = _run(folder / "cut-for-one", 16, resume="auto")
    assert one["started_at"] == 8
    for name, value in result["full"].items():
        assert float((value - one["params"][name]).abs().max()) < 1e-4, name
    # the world of one went on writing DCP folders (no group: DCP without collectives)
    assert ck.CheckpointManager(folder / "cut-for-one").latest().name == (
        "ckpt-e000002-s000000012.dcp"
    )
