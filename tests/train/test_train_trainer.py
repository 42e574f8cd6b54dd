"""DistributedTrainer on real gloo ranks: accuracy, exact metrics, inputs, accumulation, precision.

Resume and elastic resume live in ``test_train_trainer_resume.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import rankwise.distributed as rd
from rankwise.testing import run_distributed
from rankwise.train import DistributedTrainer, DistributedTrainingConfig


def digits() -> tuple[np.ndarray, ...]:
    """Digits as numpy arrays (float64 inputs, int64 labels): 1437 train / 360 test."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order] / 16.0, y[order]
    return x[:1437], y[:1437], x[1437:], y[1437:]


def mlp(seed: int = 0, inputs: int = 64, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(inputs, 64), nn.ReLU(), nn.Dropout(dropout), nn.Linear(64, 10))


def quiet(**fields: Any) -> DistributedTrainingConfig:
    fields.setdefault("verbose", False)
    fields.setdefault("checkpoint_dir", None)
    return DistributedTrainingConfig(**fields)


# -- a real fit on digits, from numpy arrays -------------------------------------------------


def _fit_digits(out_dir: str) -> dict[str, Any]:
    x, y, x_test, y_test = digits()
    model = mlp()
    trainer = DistributedTrainer(
        model, nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters(), lr=3e-3)
    )
    cfg = quiet(epochs=10, batch_size=32, validation_split=0.1, checkpoint_dir=out_dir)
    history = trainer.fit(x, y, cfg)  # numpy float64 / int64 straight in
    loss, accuracy = trainer.evaluate(x_test, y_test)
    predictions = trainer.predict(x_test)
    predicted_accuracy = float((predictions.argmax(1).numpy() == y_test).mean())
    # bf16 autocast runs through the same loop (a short second fit on a fresh trainer).
    bf16_model = mlp(1)
    bf16 = DistributedTrainer(
        bf16_model, nn.CrossEntropyLoss(), lambda p: torch.optim.SGD(p, lr=0.1)
    )
    bf16_history = bf16.fit(x, y, quiet(epochs=2, batch_size=64, precision="bf16"))
    return {
        "history": history.to_dict(),
        "accuracy": accuracy,
        "loss": loss,
        "predicted_accuracy": predicted_accuracy,
        "prediction_shape": tuple(predictions.shape),
        "bf16_losses": bf16_history.train_losses,
        "checkpoints": sorted(p.name for p in Path(out_dir).glob("*.pt")),
    }


@pytest.mark.timeout(200)
def test_fit_on_two_ranks_reaches_the_accuracy_on_digits(tmp_path: Path) -> None:
    results = run_distributed(_fit_digits, 2, args=(str(tmp_path),), timeout=170)
    first = results[0]
    assert first["accuracy"] >= 0.93, first
    assert results[1]["accuracy"] == first["accuracy"]  # every rank gets the reduced metric
    history = first["history"]
    assert len(history["train_losses"]) == 10 and len(history["val_accuracies"]) == 10
    assert history["train_losses"][-1] < history["train_losses"][0]
    assert history["val_accuracies"][-1] > 0.9
    assert history["world_size"] == 2 and history["effective_batch_size"] == 64
    assert history["samples_per_second"] > 0 and len(history["epoch_times"]) == 10
    # predict: every test sample once, in order, on every rank, padding removed
    assert first["prediction_shape"] == (360, 10)
    assert first["predicted_accuracy"] == pytest.approx(first["accuracy"], abs=1e-9)
    assert len(first["bf16_losses"]) == 2 and all(np.isfinite(first["bf16_losses"]))
    assert first["checkpoints"], "rank 0 writes checkpoints"


# -- exact metrics on 1, 2, 3 and 4 ranks ---------------------------------------------------


def _evaluate_fixed_model() -> dict[str, Any]:
    torch.manual_seed(3)
    # 103 samples: divisible by neither 2, 3, 4 nor the batch size 8.
    x, y = torch.randn(103, 64), torch.randint(0, 10, (103,))
    model = mlp(seed=5)
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters()))
    loss, accuracy = trainer.evaluate(x, y, batch_size=8)
    return {"loss": loss, "accuracy": accuracy, **trainer.last_evaluation}


@pytest.mark.timeout(300)
def test_evaluation_is_exact_on_one_to_four_ranks() -> None:
    results = [
        run_distributed(_evaluate_fixed_model, world, timeout=70)[0] for world in (1, 2, 3, 4)
    ]
    reference = results[0]
    assert reference["count"] == 103
    for result in results[1:]:
        assert result["count"] == 103  # padded duplicates never counted
        assert result["correct"] == reference["correct"]
        assert result["loss"] == pytest.approx(reference["loss"], rel=1e-6)
        assert result["accuracy"] == reference["accuracy"]


# -- inputs: a dict-returning VAE, an uneven DataLoader; accumulation ------------------------


class TinyVAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc, self.dec = nn.Linear(8, 4), nn.Linear(2, 8)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        mu, logvar = self.enc(x).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        recon = self.dec(z)
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(1).mean()
        return {"loss": nn.functional.mse_loss(recon, x) + 1e-3 * kl, "recon": recon}


def _vae() -> list[float]:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 8))  # inputs alone
    model = TinyVAE()
    trainer = DistributedTrainer(model, None, torch.optim.Adam(model.parameters(), lr=1e-2))
    history = trainer.fit(data, config=quiet(epochs=3, batch_size=16))
    return history.train_losses


def _uneven_loader() -> str:
    x, y = torch.randn(40, 64), torch.randint(0, 10, (40,))
    rows = 24 if rd.get_rank() == 0 else 16  # 3 batches on rank 0, 2 on rank 1
    loader = DataLoader(TensorDataset(x[:rows], y[:rows]), batch_size=8)
    model = mlp()
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters()))
    try:
        trainer.fit(loader, config=quiet(epochs=1))
    except ValueError as exc:
        return str(exc)
    return "no error"


class Stream(torch.utils.data.IterableDataset):
    """An iterable data set without len(): ``rows`` samples on this rank."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __iter__(self):  # type: ignore[no-untyped-def]
        g = torch.Generator().manual_seed(rd.get_rank())
        for _ in range(self.rows):
            yield torch.randn(64, generator=g), torch.randint(0, 10, (), generator=g)


def _unsized(rows_rank1: int) -> str:
    model = mlp()
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters()))
    rows = 32 if rd.get_rank() == 0 else rows_rank1
    try:
        history = trainer.fit(DataLoader(Stream(rows), batch_size=8), config=quiet(epochs=1))
    except ValueError as exc:
        return str(exc)
    return f"trained {len(history.train_losses)}"


def _accumulate(accum: int, batch: int) -> list[torch.Tensor]:
    torch.manual_seed(1)
    x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
    model = mlp()
    trainer = DistributedTrainer(
        model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.5)
    )
    trainer.fit(x, y, quiet(epochs=2, batch_size=batch, grad_accum_steps=accum))
    return [p.detach().clone() for p in model.parameters()]


def _inputs_and_accumulation() -> dict[str, Any]:
    one_big = _accumulate(1, 16)
    two_small = _accumulate(2, 8)
    return {
        "vae": _vae(),
        "uneven": _uneven_loader(),
        "unsized_even": _unsized(32),
        "unsized_uneven": _unsized(16),
        "accum_diff": max(
            float((a - b).abs().max()) for a, b in zip(one_big, two_small, strict=True)
        ),
    }


@pytest.mark.timeout(200)
def test_vae_uneven_loader_and_accumulation_on_two_ranks() -> None:
    results = run_distributed(_inputs_and_accumulation, 2, timeout=170)
    vae = results[0]["vae"]
    assert len(vae) == 3 and vae[-1] < vae[0]
    for result in results:  # refused on every rank, with the counts, instead of a hang
        assert "rank 0: 3, rank 1: 2" in result["uneven"], result["uneven"]
        assert "DistributedSampler" in result["uneven"]
    for result in results:  # loaders without len(): ranks agree per step, never hang
        assert result["unsized_even"] == "trained 1"
        assert "ranks [1] ran out of batches after 2 steps" in result["unsized_uneven"]
    # 2 micro-batches of 8 per rank == one batch of 16 per rank (DDP, no compression)
    assert results[0]["accum_diff"] < 1e-5


# -- learning-rate rules, in a world of one ------------------------------------------------


def test_linear_lr_scaling_once_and_scheduler_per_step(tmp_path: Path) -> None:
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps: list[float] = []
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: steps.append(s) or 1.0)
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), optimizer, scheduler)
    cfg = quiet(
        epochs=2, batch_size=16, lr_scaling="linear", base_batch_size=8, scheduler_interval="step"
    )
    trainer.fit(x, y, cfg)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.2)  # 16 x 1 rank / 8
    assert len(steps) == 1 + 8  # construction, then one per optimizer step (4 per epoch x 2)
    trainer.fit(x, y, cfg)  # a second fit does not scale again
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.2)


# -- explicit checkpoints, gradient checkpointing, the audit hook (a world of one) ------------


class Pairs(torch.utils.data.Dataset):
    """A plain map-style Dataset (not tensors): the trainer builds a DataLoader for it."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def test_save_load_checkpoint_gradient_checkpointing_and_sample_ids(tmp_path: Path) -> None:
    data = Pairs(50)
    model = mlp()
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters()))
    seen: dict[int, list[int]] = {}
    trainer.on_batch = lambda _t, epoch, _step, ids: seen.setdefault(epoch, []).extend(ids.tolist())
    cfg = quiet(epochs=2, batch_size=8, validation_split=0.2, gradient_checkpointing=True)
    trainer.fit(data, config=cfg)
    # every training sample once per epoch, as indices of the user's data set (40 of 50 rows)
    assert [len(v) for v in seen.values()] == [40, 40]
    assert sorted(seen[0]) == sorted(seen[1]) and len(set(seen[0])) == 40
    assert max(seen[0]) < 50
    expected = trainer.evaluate(data)
    trainer.save_checkpoint(tmp_path / "explicit.pt")
    fresh = mlp(seed=9)
    other = DistributedTrainer(fresh, nn.CrossEntropyLoss(), torch.optim.Adam(fresh.parameters()))
    other.load_checkpoint(tmp_path / "explicit.pt")  # before any fit: evaluate a saved model
    # the same evaluation batches (a fresh trainer has no config to take them from): a float32
    # forward over 8 rows may round differently from one over 64, which is BLAS, not the model
    assert other.evaluate(data, batch_size=8) == expected


# -- bad input -------------------------------------------------------------------------------


def test_fit_refuses_bad_arguments() -> None:
    model = mlp()
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters()))
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    with pytest.raises(ValueError, match="exactly one DistributedTrainingConfig"):
        trainer.fit(x, y)
    with pytest.raises(ValueError, match="same number of samples"):
        trainer.fit(x, y[:5], quiet(epochs=1))
    with pytest.raises(ValueError, match=r"\(X, y\) or \(X, y, X_val, y_val\)"):
        trainer.fit(x, y, x, quiet(epochs=1))
    with pytest.raises(TypeError, match=r"torch\.optim\.Optimizer"):
        DistributedTrainer(model, nn.CrossEntropyLoss(), "adam")  # type: ignore[arg-type]
