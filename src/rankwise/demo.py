"""The ``rankwise demo`` training script: an MLP on scikit-learn's digits, on the trainer.

Runs unchanged on one process (``python -m rankwise.demo``) and on N (``rankwise demo`` or
``rankwise launch --nproc-per-node N -m rankwise.demo``). :class:`DistributedTrainer` does the
work: each rank trains on its own shard, DDP averages gradients, metrics are reduced exactly
over all ranks, rank 0 shows a progress bar and writes into ``--out``: ``history.json``,
``history.png``, a CSV log (``logs/``) and checkpoints (``checkpoints/``).

    python -m rankwise.demo --out /tmp/demo epochs=5 precision=bf16
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

import rankwise.distributed as rd
from rankwise.train import DistributedTrainer, DistributedTrainingConfig


def load_digits_split(seed: int, test_fraction: float = 0.2) -> tuple[np.ndarray, ...]:
    """Digits (1797 x 64, 10 classes) scaled to [0, 1], split by a seeded permutation."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = round(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    x = x / 16.0
    return x[train], y[train], x[test], y[test]


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )


def demo_config(
    out: Path, config: str | None, overrides: Sequence[str]
) -> DistributedTrainingConfig:
    """The demo's defaults (or, with ``--config``, the YAML file's settings), then the
    ``field=value`` overrides."""
    if config is not None:
        return DistributedTrainingConfig.from_yaml(config, overrides=list(overrides))
    defaults = DistributedTrainingConfig(
        epochs=15,
        batch_size=32,
        seed=0,
        log_every_n_batches=5,
        checkpoint_dir=str(out / "checkpoints"),
        log_dir=str(out / "logs"),
        validation_split=0.1,
    )
    return defaults.with_overrides(list(overrides))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out", default="./rankwise-demo", help="output folder (default ./rankwise-demo)"
    )
    p.add_argument("--config", default=None, help="a DistributedTrainingConfig YAML file")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    p.add_argument("overrides", nargs="*", help="config fields, e.g. epochs=5 precision=bf16")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> float:
    args = parse_args(argv)
    rd.init()
    out = Path(args.out)
    cfg = demo_config(out, args.config, args.overrides)
    torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP also broadcasts)
    x_train, y_train, x_test, y_test = load_digits_split(cfg.seed)
    model = make_model()
    trainer = DistributedTrainer(
        model, nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters(), lr=args.lr)
    )
    world = rd.get_world_size()
    if rd.is_master():
        print(
            f"rankwise demo: {world} rank(s), {len(x_train)} train / {len(x_test)} test samples, "
            f"global batch {cfg.effective_batch_size(world)}, backend {rd.get_backend()}, "
            f"output in {out}",
            flush=True,
        )
    history = trainer.fit(x_train, y_train, cfg)
    tested = time.perf_counter()
    _, accuracy = trainer.evaluate(x_test, y_test)
    if rd.is_master():
        history.save(out / "history.json")
        history.plot(out / "history.png")
        # Training's time as history.png's title gives it (the fit's), the test apart.
        print(
            f"final test accuracy: {accuracy:.4f} over {trainer.last_evaluation['count']} "
            f"samples ({world} ranks; trained in {history.total_time_seconds:,.1f} s, "
            f"tested in {time.perf_counter() - tested:.1f} s); wrote "
            f"{out / 'history.json'}, {out / 'history.png'}, {cfg.log_dir}, {cfg.checkpoint_dir}",
            flush=True,
        )
    rd.finalize()
    return float(accuracy or 0.0)


if __name__ == "__main__":
    main()
