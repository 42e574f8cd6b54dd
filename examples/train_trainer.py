"""A complete DistributedTrainer run: the README's trainer example, runnable.

Digits (scikit-learn) from numpy arrays, a held-out validation split, gradient accumulation,
checkpoints every few optimizer steps with automatic resume, a callback, exact test metrics.
The same script runs on one process and on N; run it twice and the second run resumes from
the newest checkpoint (and has nothing left to do).

    python examples/train_trainer.py
    rankwise launch --nproc-per-node 2 examples/train_trainer.py --out /tmp/run
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn

from rankwise.train import DistributedTrainer, DistributedTrainingConfig


class PrintBest:
    """A callback: any object with some of on_fit_start / on_epoch_end / on_checkpoint_saved /
    on_fit_end (and on_batch)."""

    def __init__(self) -> None:
        self.best = 0.0

    def on_epoch_end(self, trainer: DistributedTrainer, epoch: int, metrics: dict) -> None:
        self.best = max(self.best, metrics["val_accuracy"] or 0.0)

    def on_fit_end(self, trainer: DistributedTrainer, history: object) -> None:
        if trainer.is_master():
            print(f"best validation accuracy: {self.best:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="./trainer-example")
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()

    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)  # float64 / int64 numpy arrays, used as they are
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order] / 16.0, y[order]
    x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    trainer = DistributedTrainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.AdamW(model.parameters(), lr=2e-3),
        scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs),
        callbacks=[PrintBest()],
    )
    config = DistributedTrainingConfig(
        epochs=args.epochs,
        batch_size=16,  # per rank
        grad_accum_steps=2,  # effective batch: 16 x world size x 2
        validation_split=0.1,  # the same seeded hold-out on every rank
        checkpoint_dir=f"{args.out}/checkpoints",
        checkpoint_every_n_steps=20,  # mid-epoch checkpoints: a resume continues mid-epoch
        resume="auto",  # newest valid checkpoint, if any
        log_dir=f"{args.out}/logs",  # metrics.csv (+ TensorBoard when installed)
        log_every_n_batches=10,
    )
    history = trainer.fit(x_train, y_train, config)

    loss, accuracy = trainer.evaluate(x_test, y_test)  # exact: each test sample once
    predictions = trainer.predict(x_test).argmax(1)  # in dataset order, on every rank
    if trainer.is_master():
        history.save(f"{args.out}/history.json")
        print(
            f"test loss {loss:.4f} accuracy {accuracy:.4f} over {len(predictions)} samples; "
            f"{trainer.get_world_size()} rank(s), {history.samples_per_second:,.0f} samples/s"
        )


if __name__ == "__main__":
    main()
