"""Trainer checkpoints on real ranks: a mid-epoch resume is bit-identical, a resume on another
world size with the global batch kept matches the uninterrupted run, 1 x 64 == 2 x 32, a
global batch the new world cannot split is refused, a torn checkpoint falls back."""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from helpers.trainer_stops import Stop, fit_starts, stop_in_step
from helpers.training import classification, mlp
from rankwise.testing import run_distributed
from rankwise.train import DistributedTrainer, DistributedTrainingConfig


def _run(
    n: int,
    folder: Path,
    *,
    batch_size: int,
    dropout: float = 0.0,
    stop_at: int | None = None,
    resume: str | None = None,
    grad_accum_steps: int = 1,
    every: int = 3,
    epochs: int = 2,
    epoch_every: int = 1,
    verbose: bool = False,
) -> dict[str, Any]:
    model = mlp(16, 32, 4, activation=nn.ReLU, dropout=dropout)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), optimizer)
    started_at = fit_starts(trainer)
    stop_in_step(trainer, stop_at)
    cfg = DistributedTrainingConfig(
        epochs=epochs,
        batch_size=batch_size,
        grad_accum_steps=grad_accum_steps,
        verbose=verbose,
        checkpoint_dir=str(folder),
        checkpoint_every_n_steps=every,
        checkpoint_every_n_epochs=epoch_every,
        keep_last_checkpoints=None,
        resume=resume,
    )
    x, y = classification(n, 16, 4, seed=7)
    stopped = False
    try:
        history = trainer.fit(x, y, cfg).train_losses
    except Stop:
        stopped, history = True, []
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "losses": history,
        "stopped": stopped,
        "started_at": started_at[0],
    }


# -- mid-epoch resume, bit-identical ---------------------------------------------------------


def _bit_identical(tmp: str) -> dict[str, Any]:
    # 192 samples, 2 ranks x 16: 6 optimizer steps per epoch; checkpoints every 4 steps.
    # Stopped in step 9, the last checkpoint is step 8: epoch 1, 2 steps in (mid-epoch).
    common: dict[str, Any] = {"batch_size": 16, "dropout": 0.2, "every": 4, "epochs": 3}
    full = _run(192, Path(tmp, "full"), **common)
    cut = _run(192, Path(tmp, "cut"), stop_at=9, **common)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # every rank's console, for the resume's line
        resumed = _run(192, Path(tmp, "cut"), resume="auto", verbose=True, **common)
    return {
        "printed": printed.getvalue(),
        "equal": all(
            torch.equal(a, b) for a, b in zip(full["params"], resumed["params"], strict=True)
        ),
        "stopped": cut["stopped"],
        "started_at": resumed["started_at"],
        "full_losses": full["losses"],
        "resumed_losses": resumed["losses"],
    }


@pytest.mark.timeout(300)
def test_a_run_resumed_mid_epoch_ends_bit_identical(tmp_path: Path) -> None:
    results = run_distributed(_bit_identical, 2, args=(str(tmp_path),), timeout=170)
    for result in results:
        assert result["stopped"] and result["started_at"] == 8  # resumed mid-epoch 1
        assert result["equal"], "parameters differ from the uninterrupted run"
        # the resumed epoch's loss includes the part before the crash, exactly once
        assert result["resumed_losses"] == pytest.approx(result["full_losses"], rel=1e-12)
    # The resume says so, once (rank 0): which checkpoint, where in the run, what is left.
    said = [line for r in results for line in r["printed"].splitlines() if "resumed" in line]
    checkpoint = tmp_path / "cut" / "ckpt-e000001-s000000008.pt"
    assert said == [
        f"rankwise: resumed from {checkpoint}: epoch 2/3, optimizer step 8; "
        "4 batches of epoch 2 left (64 of its 192 samples done)"
    ]


def test_a_step_checkpoint_on_an_epoch_s_last_step_resumes_at_the_next_epoch(
    tmp_path: Path,
) -> None:
    # 96 samples x 16: 6 steps an epoch, a step checkpoint every 3 (dividing it), no epoch
    # checkpoints. Stopped in step 7, the last checkpoint is step 6: the end of epoch 0.
    common: dict[str, Any] = {"batch_size": 16, "every": 3, "epochs": 3, "epoch_every": 0}
    full = _run(96, tmp_path / "full", **common)
    assert _run(96, tmp_path / "cut", stop_at=7, **common)["stopped"]
    resumed = _run(96, tmp_path / "cut", resume="auto", **common)
    assert resumed["started_at"] == 6
    assert all(torch.equal(a, b) for a, b in zip(full["params"], resumed["params"], strict=True))
    assert resumed["losses"] == full["losses"]


# -- another world size, the global batch kept; 1 x 64 == 2 x 32 ----------------------------


def _two_ranks(tmp: str) -> dict[str, Any]:
    # 512 samples, 2 ranks x 32 = 64 a step: 8 steps an epoch; checkpoints every 3 steps.
    full = _run(512, Path(tmp, "full2"), batch_size=32)
    cut = _run(512, Path(tmp, "cut2"), batch_size=32, stop_at=10)  # last checkpoint: step 9
    return {"params": full["params"], "stopped": cut["stopped"]}


@pytest.mark.timeout(300)
def test_resume_on_another_world_size_keeps_the_run(tmp_path: Path) -> None:
    two = run_distributed(_two_ranks, 2, args=(str(tmp_path),), timeout=170)[0]
    assert two["stopped"]
    # A world of one in this process: the same global batch as one rank x 64.
    with pytest.raises(
        ValueError,
        match=r"saved global batch 64 cannot be split over 1 ranks x 3 accumulation steps",
    ):
        _run(512, tmp_path / "cut2", batch_size=21, grad_accum_steps=3, resume="auto")
    resumed = _run(512, tmp_path / "cut2", batch_size=64, resume="auto")
    assert resumed["started_at"] == 9
    single = _run(512, tmp_path / "single", batch_size=64)

    def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))

    assert max_diff(resumed["params"], two["params"]) < 1e-4
    assert max_diff(single["params"], two["params"]) < 1e-4  # 1 x 64 == 2 x 32


# -- a torn checkpoint ------------------------------------------------------------------------


def test_a_torn_checkpoint_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    first = _run(128, tmp_path, batch_size=16, every=3, epochs=1)  # 8 steps: saves at 3, 6, 8
    assert not first["stopped"]
    newest = sorted(tmp_path.glob("*.pt"))[-1]
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])  # torn: a crash mid-write
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = _run(128, tmp_path, batch_size=16, every=3, epochs=2, resume="auto")
    assert resumed["started_at"] == 6  # the previous good checkpoint
    assert any(newest.name in str(w.message) for w in caught), [str(w.message) for w in caught]


# -- FSDP2: optimizer rebuilt over the sharded parameters, checkpoint and resume --------------


def _fsdp(tmp: str) -> dict[str, Any]:
    x, y = classification(96, 16, 4, seed=7)
    model = mlp(16, 32, 4, activation=nn.ReLU, dropout=0.0)
    trainer = DistributedTrainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.Adam(model.parameters(), lr=1e-2),  # an instance: rebuilt after sharding
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5),
    )
    cfg = DistributedTrainingConfig(
        epochs=2,
        batch_size=8,
        verbose=False,
        checkpoint_dir=tmp,
        strategy="fsdp",
        grad_clip_norm=1.0,
    )
    first = trainer.fit(x, y, cfg).train_losses
    evaluated = trainer.evaluate(x, y)
    cfg.resume, cfg.epochs = "auto", 3  # the guide's style: fields set after construction
    again = DistributedTrainer(
        mlp(16, 32, 4, activation=nn.ReLU, dropout=0.0),
        nn.CrossEntropyLoss(),
        lambda p: torch.optim.Adam(p, lr=1e-2),
    )
    resumed = again.fit(x, y, cfg).train_losses
    return {
        "wrapped": type(trainer.model).__name__,
        "first": first,
        "resumed": resumed,
        "evaluated": evaluated,
        "lr": trainer.optimizer.param_groups[0]["lr"] if trainer.optimizer else None,
    }


@pytest.mark.timeout(300)
def test_fsdp_fit_evaluate_and_resume(tmp_path: Path) -> None:
    result = run_distributed(_fsdp, 2, args=(str(tmp_path),), timeout=170)[0]
    assert result["wrapped"].startswith("FSDP")
    assert len(result["resumed"]) == 3 and result["resumed"][:2] == result["first"]
    assert result["lr"] == pytest.approx(1e-2 * 0.25)  # the scheduler stepped per epoch
    assert 0 <= result["evaluated"][1] <= 1
