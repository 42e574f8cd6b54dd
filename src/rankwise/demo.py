"""The ``rankwise demo`` training script: an MLP on scikit-learn's digits, data-parallel.

Runs unchanged on one process (``python -m rankwise.demo``) and on N (``rankwise demo`` or
``rankwise launch --nproc-per-node N -m rankwise.demo``). Each rank trains on its own shard of
every epoch; DDP averages gradients; metrics are reduced over all ranks before rank 0 prints
them, and the test accuracy is computed exactly over the real test samples (each rank scores
one contiguous block; no padded duplicates).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import rankwise.distributed as rd
from rankwise.data import DistributedSampler, contiguous_range
from rankwise.parallel import wrap_model


def load_digits_split(seed: int, test_fraction: float = 0.2) -> tuple[torch.Tensor, ...]:
    """Digits (1797 x 64, 10 classes) scaled to [0, 1], split by a seeded permutation."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = round(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    xt = torch.tensor(x / 16.0, dtype=torch.float32)
    yt = torch.tensor(y, dtype=torch.long)
    return xt[train], yt[train], xt[test], yt[test]


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Exact loss and accuracy over all of ``x``: each rank scores one contiguous block."""
    start, end = contiguous_range(len(x), rd.get_world_size(), rd.get_rank())
    logits = model(x[start:end])
    n = end - start
    loss = nn.functional.cross_entropy(logits, y[start:end], reduction="sum").item() if n else 0.0
    correct = (logits.argmax(1) == y[start:end]).sum().item() if n else 0
    # Weighted by sample count, so the mean is over samples, not over ranks.
    return rd.reduce_metrics({"loss": loss / max(n, 1), "accuracy": correct / max(n, 1)}, weight=n)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> float:
    args = parse_args(argv)
    rd.init()
    world = rd.get_world_size()
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP also broadcasts)
    x_train, y_train, x_test, y_test = load_digits_split(args.seed)

    # DDP on N ranks (rank 0's weights broadcast), the plain module in a world of one.
    model = wrap_model(make_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    dataset = TensorDataset(x_train, y_train)
    # Shuffled by an O(1)-memory seeded permutation; rank r takes every world-th position.
    sampler = DistributedSampler(dataset, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    if rd.is_master():
        print(
            f"rankwise demo: {world} rank(s), {len(x_train)} train / {len(x_test)} test samples, "
            f"global batch {args.batch_size * world}, backend {rd.get_backend()}",
            flush=True,
        )
    started = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        t0 = time.perf_counter()
        loss_sum, correct, seen = 0.0, 0, 0
        for xb, yb in loader:
            optimizer.zero_grad(set_to_none=True)
            logits = model(xb)
            loss = nn.functional.cross_entropy(logits, yb)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(xb)
            correct += (logits.argmax(1) == yb).sum().item()
            seen += len(xb)
        train = rd.reduce_metrics(
            {"loss": loss_sum / seen, "accuracy": correct / seen}, weight=seen
        )
        model.eval()
        test = evaluate(model, x_test, y_test)
        if rd.is_master():
            print(
                f"epoch {epoch + 1:>3}/{args.epochs}  loss {train['loss']:.4f}  "
                f"acc {train['accuracy']:.4f}  test_loss {test['loss']:.4f}  "
                f"test_acc {test['accuracy']:.4f}  ({time.perf_counter() - t0:.2f} s)",
                flush=True,
            )
    final = evaluate(model, x_test, y_test)["accuracy"]
    if rd.is_master():
        print(
            f"final test accuracy: {final:.4f} over {len(x_test)} samples "
            f"({world} ranks, {time.perf_counter() - started:.1f} s)",
            flush=True,
        )
    rd.finalize()
    return final


if __name__ == "__main__":
    main()
