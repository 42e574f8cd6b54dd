"""The trainer's own per-step cost, measured so that machine load does not move it.

Wall time on a shared machine swings 2.5x between runs; these two measures hardly move:

- **calls per optimizer step**: every Python and C function call (``sys.setprofile``
  events), and separately every call into the torch API (a ``TorchFunctionMode``: tensor
  ops, methods and properties), counted over ``STEPS`` optimizer steps inside the first
  epoch. Exact and the same on every run: they count work, not time.
- **CPU time per step** (``time.thread_time``, this thread only): one process, a world of
  one, one torch thread, so all of a step's work is on this thread and none is waiting.
  The implementations run in rounds, interleaved in a rotating order; each round gives a
  ratio against each loop, and the median of the ratios (with their spread) is reported.
  Load still slows the CPU a little (shared caches, frequency), but a round's runs alike.

Implementations (digits MLP 64-128-128-10, batch 32, SGD with momentum, cross-entropy, the
same initial weights and rankwise's ``DistributedSampler`` order, seed 42):

- ``ddp loop (DataLoader)``: the loop a user writes, DataLoader over a TensorDataset;
- ``ddp loop (indexing)``: the same loop indexing the tensors a batch at a time (what the
  trainer does for in-memory arrays);
- ``rankwise trainer``: ``DistributedTrainer.fit(x, y, cfg)``.

In a world of one nothing is wrapped in DDP (by the trainer or the loops), so what differs is
the trainer's own Python work per step. ``benchmarks/trainer.py`` imports :func:`overhead`
and prints this table first; run alone::

    PYTHONPATH=src python benchmarks/trainer_overhead.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rankwise.testing import TorchCalls

WARMUP = 10  # optimizer steps before anything is timed
COUNT_FROM, STEPS = 5, 50  # optimizer steps whose calls are counted (epoch 0 has 57)
EPOCHS = 2  # per timed run: 2 x 57 steps on the digits data


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )


def _optimizer(model: nn.Module, on_step: Callable[[], None]) -> torch.optim.Optimizer:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    optimizer.register_step_post_hook(lambda *_: on_step())
    return optimizer


def _loop(indexing: bool, x: torch.Tensor, y: torch.Tensor, on_step: Callable[[], None]) -> Any:
    from torch.utils.data import DataLoader, TensorDataset

    from rankwise.data import DistributedSampler

    model = _model()
    optimizer = _optimizer(model, on_step)
    loss_fn = nn.CrossEntropyLoss()
    sampler = DistributedSampler(len(x), shuffle=True, seed=42)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, sampler=sampler)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        if indexing:
            index = torch.tensor(list(sampler))
            batches: Any = (
                (x[index[i : i + 32]], y[index[i : i + 32]]) for i in range(0, len(index), 32)
            )
        else:
            batches = loader
        for xb, yb in batches:
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(xb), yb).backward()
            optimizer.step()
    return model


def _trainer(x: torch.Tensor, y: torch.Tensor, on_step: Callable[[], None]) -> Any:
    from rankwise.train import DistributedTrainer, DistributedTrainingConfig

    model = _model()
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), _optimizer(model, on_step))
    cfg = DistributedTrainingConfig(
        epochs=EPOCHS, batch_size=32, verbose=False, checkpoint_dir=None, seed=42
    )
    trainer.fit(x, y, cfg)
    return model


IMPLS: dict[str, Callable[..., Any]] = {
    "ddp loop (DataLoader)": lambda x, y, hook: _loop(False, x, y, hook),
    "ddp loop (indexing)": lambda x, y, hook: _loop(True, x, y, hook),
    "rankwise trainer": _trainer,
}


def calls_per_step(
    run: Callable[..., Any], x: torch.Tensor, y: torch.Tensor
) -> tuple[float, float]:
    """(function calls, Python and C; calls into torch) per optimizer step, over the steps
    COUNT_FROM..COUNT_FROM+STEPS of the first epoch (no epoch boundary inside)."""
    count, steps = [0], [0]

    def profile(_frame: Any, event: str, _arg: Any) -> None:
        if event in ("call", "c_call"):
            count[0] += 1

    def on_step() -> None:
        steps[0] += 1
        if steps[0] in (COUNT_FROM, COUNT_FROM + STEPS):
            sys.setprofile(profile if steps[0] == COUNT_FROM else None)

    try:
        run(x, y, on_step)
    finally:
        sys.setprofile(None)
    torch_calls = TorchCalls()

    def on_step_torch() -> None:
        steps[0] += 1
        torch_calls.on = COUNT_FROM <= steps[0] < COUNT_FROM + STEPS

    steps[0] = 0
    with torch_calls:
        run(x, y, on_step_torch)
    return count[0] / STEPS, sum(torch_calls.calls.values()) / STEPS


def cpu_per_step(run: Callable[..., Any], x: torch.Tensor, y: torch.Tensor) -> tuple[float, Any]:
    """Median CPU seconds of this thread between consecutive optimizer steps after warm-up,
    and the final weights."""
    stamps: list[float] = []
    model = run(x, y, lambda: stamps.append(time.thread_time()))
    gaps = [b - a for a, b in zip(stamps[WARMUP:], stamps[WARMUP + 1 :], strict=False)]
    return statistics.median(gaps), model.state_dict()


def overhead(rounds: int = 15) -> list[dict[str, Any]]:
    """Print and return the table: calls per step, CPU time per step, and each
    implementation's speed against both loops as the median of per-round ratios."""
    torch.set_num_threads(1)
    x, y = _data()
    names = list(IMPLS)
    times: dict[str, list[float]] = {n: [] for n in names}
    states: dict[str, Any] = {}
    for r in range(rounds):
        # Rotate the order, so no implementation always runs first (or after the same one).
        for name in names[r % 3 :] + names[: r % 3]:
            seconds, states[name] = cpu_per_step(IMPLS[name], x, y)
            times[name].append(seconds)
    print(
        f"\nworld of one, digits MLP, 1 torch thread: calls per step over {STEPS} steps; CPU "
        f"time per step (thread_time, median over a run), {rounds} rounds in rotating order; "
        "'vs' = median over rounds of (the loop's time / this one's), spread min-max"
    )
    print(
        f"{'implementation':<24} {'calls/step':>10} {'torch/step':>10} {'CPU ms/step':>12} "
        f"{'vs DataLoader loop':>24} {'vs indexing loop':>24} {'weights':>10}"
    )
    rows = []
    for name in names:
        calls, torch_calls = calls_per_step(IMPLS[name], x, y)
        same = all(torch.equal(states[name][k], v) for k, v in states[names[0]].items())
        row: dict[str, Any] = {
            "implementation": name,
            "calls_per_step": calls,
            "torch_calls_per_step": torch_calls,
            "cpu_ms_per_step": statistics.median(times[name]) * 1e3,
            "cpu_ms_per_round": [t * 1e3 for t in times[name]],
            "weights_equal_to_dataloader_loop": same,
        }
        cells = []
        for base, key in ((names[0], "vs_dataloader_loop"), (names[1], "vs_indexing_loop")):
            ratios = [b / t for b, t in zip(times[base], times[name], strict=True)]
            row[key] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
            cells.append(f"{row[key]['median']:.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
        print(
            f"{name:<24} {calls:>10.1f} {torch_calls:>10.1f} {row['cpu_ms_per_step']:>12.3f} {cells[0]:>24} "
            f"{cells[1]:>24} {'identical' if same else 'DIFFER':>10}"
        )
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    overhead(parser.parse_args().rounds)


if __name__ == "__main__":
    main()
