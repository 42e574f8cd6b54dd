"""DistributedTrainer against a hand-written DDP loop, Lightning Fabric and HF Accelerate.

First the trainer's own per-step cost in a world of one, in measures load does not move
(``trainer_overhead.py``: calls per step, thread CPU time). Then each implementation does the
same work on 2 gloo CPU ranks under ``rankwise launch``: the same model and initial weights,
the same data order (rankwise's DistributedSampler, seed 42), the same per-rank batch, SGD with
momentum, cross-entropy. Per run: the median time per iteration after warm-up, between
consecutive optimizer steps (an ``optimizer.register_step_post_hook`` stamp, identical for
every implementation; Lightning Fabric's parity-test measure), as wall time and as the main
thread's CPU time (``time.thread_time``: no wait for the peer, no time lent to other jobs).
The implementations run in rounds, interleaved in a rotating order; each round gives a ratio
against the DataLoader loop and the table reports the median of those ratios and their spread
(load that comes and goes hits a round's runs alike; a best-of-N would pick the quietest
moment of each). The final weights are compared with the DataLoader loop's.

Workloads: the digits MLP (64-128-128-10, scikit-learn's digits) and a wide MLP
(784-2048-2048-10, synthetic data). Baselines:

- ``ddp loop (DataLoader)``: what a user writes: DataLoader over a TensorDataset with the
  sampler, DDP, zero_grad / forward / backward / step;
- ``ddp loop (indexing)``: the same loop indexing the tensors a batch at a time in each step
  (what the trainer does for in-memory arrays), to show the trainer's own overhead;
- ``trainer, no Progress marks``: a diagnostic: the trainer with its per-step stall mark (one
  TCPStore set) switched off, to show what that guarantee costs;
- ``Lightning Fabric`` / ``HF Accelerate``: their DDP over the same loader and sampler.

    python benchmarks/trainer.py            # prints a table, writes benchmarks/out/trainer.json
    python benchmarks/trainer.py --quick    # fewer iterations
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from run_header import run_header  # beside this file
from torch import nn

IMPLS = (
    "ddp loop (DataLoader)",
    "ddp loop (indexing)",
    "rankwise trainer",
    "trainer, no Progress marks",
    "Lightning Fabric",
    "HF Accelerate",
)
KEYS = ("loop", "indexing", "trainer", "unmarked", "fabric", "accelerate")
WARMUP = 10


# -- the workloads ------------------------------------------------------------------------------


def make_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "digits":
        return nn.Sequential(
            nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
        )
    return nn.Sequential(
        nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )


def make_data(name: str, quick: bool) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(x, y, per-rank batch, epochs)."""
    if name == "digits":
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        return (
            torch.tensor(x / 16.0, dtype=torch.float32),
            torch.tensor(y),
            32,
            3 if quick else 8,
        )
    g = torch.Generator().manual_seed(0)
    n = 64 * 2 * (20 if quick else 50)
    return torch.randn(n, 784, generator=g), torch.randint(0, 10, (n,), generator=g), 64, 2


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


# -- one rank of one implementation -------------------------------------------------------------


def worker(workload: str, out: str, quick: bool, rounds: int) -> None:
    """Every implementation, ``rounds`` times in a rotating order, in this one process pair
    (they share the process group): load changes on a shared machine hit all of them alike."""
    import rankwise.distributed as rd

    torch.set_num_threads(1)
    rd.init()
    x, y, batch, epochs = make_data(workload, quick)
    runners = {"loop": _loop, "indexing": _loop, "fabric": _fabric}
    runners |= {"trainer": _trainer, "unmarked": _trainer}
    results: dict[str, Any] = {key: {"medians": [], "cpu": [], "gaps": []} for key in KEYS}
    for r in range(rounds):
        for key in KEYS[r % len(KEYS) :] + KEYS[: r % len(KEYS)]:
            model = make_model(workload)
            stamps: list[tuple[float, float]] = []
            runners.get(key, _accelerate)(key, model, x, y, batch, epochs, stamps)
            gaps = [b[0] - a[0] for a, b in itertools.pairwise(stamps)][WARMUP:]
            cpu = [b[1] - a[1] for a, b in itertools.pairwise(stamps)][WARMUP:]
            results[key]["medians"].append(statistics.median(gaps))
            results[key]["cpu"].append(statistics.median(cpu))
            results[key]["gaps"] = gaps
            results[key]["state"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            results[key]["batch"] = batch
    if rd.get_rank() == 0:
        torch.save(results, out)


def _stamp(optimizer: torch.optim.Optimizer, stamps: list[tuple[float, float]]) -> None:
    # Wall time, and this (the main) thread's CPU time: what the step costs this rank's
    # Python and torch ops, without the wait for the peer or the time other jobs took.
    optimizer.register_step_post_hook(
        lambda *_: stamps.append((time.perf_counter(), time.thread_time()))
    )


def _sampler_loader(x: torch.Tensor, y: torch.Tensor, batch: int) -> Any:
    from torch.utils.data import DataLoader, TensorDataset

    from rankwise.data import DistributedSampler

    data = TensorDataset(x, y)
    sampler = DistributedSampler(len(data), shuffle=True, seed=42)
    return sampler, DataLoader(data, batch_size=batch, sampler=sampler)


def _batches(
    impl: str, x: torch.Tensor, y: torch.Tensor, batch: int, sampler: Any, loader: Any
) -> Any:
    if impl != "indexing":
        return loader
    index = torch.tensor(list(sampler))
    # A generator: each batch is gathered in its own step, as the trainer does (a list built
    # up front would move every gather out of the timed steps, into the epoch's start).
    return ((x[index[i : i + batch]], y[index[i : i + batch]]) for i in range(0, len(index), batch))


def _loop(
    impl: str,
    model: nn.Module,
    x: Any,
    y: Any,
    batch: int,
    epochs: int,
    stamps: list[tuple[float, float]],
) -> nn.Module:
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = make_optimizer(ddp.parameters())
    _stamp(optimizer, stamps)
    loss_fn = nn.CrossEntropyLoss()
    sampler, loader = _sampler_loader(x, y, batch)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for xb, yb in _batches(impl, x, y, batch, sampler, loader):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(ddp(xb), yb).backward()
            optimizer.step()
    return model


def _trainer(
    impl: str,
    model: nn.Module,
    x: Any,
    y: Any,
    batch: int,
    epochs: int,
    stamps: list[tuple[float, float]],
) -> nn.Module:
    import rankwise.distributed as rd
    from rankwise.train import DistributedTrainer, DistributedTrainingConfig

    optimizer = make_optimizer(model.parameters())
    _stamp(optimizer, stamps)
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), optimizer)
    cfg = DistributedTrainingConfig(
        epochs=epochs, batch_size=batch, verbose=False, checkpoint_dir=None, seed=42
    )
    if impl != "unmarked":
        trainer.fit(x, y, cfg)
        return model
    # A diagnostic, not a configuration: what the stall diagnostics' per-step mark (one
    # TCPStore set) costs. Without it a timeout could not name the rank that is behind.
    mark = rd.Progress.mark
    rd.Progress.mark = lambda self, what: None  # type: ignore[method-assign]
    try:
        trainer.fit(x, y, cfg)
    finally:
        rd.Progress.mark = mark  # type: ignore[method-assign]
    return model


def _fabric(
    _impl: str,
    model: nn.Module,
    x: Any,
    y: Any,
    batch: int,
    epochs: int,
    stamps: list[tuple[float, float]],
) -> nn.Module:
    from lightning_fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    optimizer = make_optimizer(model.parameters())
    wrapped, optimizer = fabric.setup(model, optimizer)
    _stamp(optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer, stamps)
    loss_fn = nn.CrossEntropyLoss()
    sampler, loader = _sampler_loader(x, y, batch)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            optimizer.zero_grad(set_to_none=True)
            fabric.backward(loss_fn(wrapped(xb), yb))
            optimizer.step()
    return model


def _accelerate(
    _impl: str,
    model: nn.Module,
    x: Any,
    y: Any,
    batch: int,
    epochs: int,
    stamps: list[tuple[float, float]],
) -> nn.Module:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    optimizer = make_optimizer(model.parameters())
    wrapped, optimizer = accelerator.prepare(model, optimizer)
    _stamp(optimizer.optimizer, stamps)
    loss_fn = nn.CrossEntropyLoss()
    sampler, loader = _sampler_loader(x, y, batch)  # already sharded: not re-prepared
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(loss_fn(wrapped(xb), yb))
            optimizer.step()
    return model


# -- the driver ---------------------------------------------------------------------------------


def measure(workload: str, quick: bool, rounds: int, folder: Path) -> dict[str, Any]:
    from rankwise.testing import run_script

    out = folder / f"{workload}.pt"
    args = ["--worker", "--workload", workload, "--out", str(out), f"--rounds={rounds}"]
    proc = run_script(
        Path(__file__), 2, script_args=args + (["--quick"] if quick else []), timeout=1800
    )
    if proc.returncode != 0:
        raise SystemExit(f"{workload} failed:\n{proc.stderr[-4000:]}")
    return torch.load(out, weights_only=False)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None, help="default 6 (2 with --quick)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workload", choices=("digits", "wide"))
    parser.add_argument("--out")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 6)
    if args.worker:
        worker(args.workload, args.out, args.quick, rounds)
        return
    results: dict[str, Any] = run_header(workloads={})
    # First the trainer's own per-step cost in measures that load does not move (the
    # sibling script: python puts this folder first on sys.path).
    from trainer_overhead import overhead

    results["world_of_one"] = overhead(rounds=5 if args.quick else 15)
    with tempfile.TemporaryDirectory() as tmp:
        for workload in ("digits", "wide"):
            runs = measure(workload, args.quick, rounds, Path(tmp))
            results["workloads"][workload] = _table(workload, runs, rounds)
    out = Path(__file__).parent / "out" / "trainer.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")


def _ratios(base: list[float], own: list[float]) -> dict[str, float]:
    """Per round ``base / own`` (> 1: faster than the base), as median, min and max."""
    r = [b / o for b, o in zip(base, own, strict=True)]
    return {"median": statistics.median(r), "min": min(r), "max": max(r)}


def _cell(ratio: dict[str, float]) -> str:
    return f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})"


def _table(workload: str, runs: dict[str, Any], rounds: int) -> list[dict[str, Any]]:
    """Per implementation: wall and CPU ms/iter (median of round medians) and, per round, the
    DataLoader loop's time over this one's (the runs of a round are interleaved, so load
    that comes and goes hits them alike): the median of those ratios and their spread."""
    reference = runs["loop"]
    rows = []
    print(
        f"\n{workload}: 2 gloo ranks, rank 0; per-iteration time: median after {WARMUP} warm-up "
        f"steps per run; {rounds} rounds in rotating order; 'vs loop': median over rounds of "
        "(loop's time / this one's), min-max in brackets; CPU: the main thread's thread_time"
    )
    print(
        f"{'implementation':<28} {'iters':>6} {'ms/iter':>8} {'vs loop (wall)':>20} "
        f"{'CPU ms/iter':>12} {'vs loop (CPU)':>20} {'weights vs loop':>16}"
    )
    for name, key in zip(IMPLS, KEYS, strict=True):
        run = runs[key]
        wall, cpu = (
            _ratios(reference["medians"], run["medians"]),
            _ratios(reference["cpu"], run["cpu"]),
        )
        diff = max(float((run["state"][k] - v).abs().max()) for k, v in reference["state"].items())
        same = "identical" if diff == 0.0 else f"max diff {diff:.1e}"
        median, cpu_median = statistics.median(run["medians"]), statistics.median(run["cpu"])
        print(
            f"{name:<28} {len(run['gaps']):>6} {median * 1e3:>8.3f} {_cell(wall):>20} "
            f"{cpu_median * 1e3:>12.3f} {_cell(cpu):>20} {same:>16}"
        )
        rows.append(
            {
                "implementation": name,
                "iterations": len(run["gaps"]),
                "round_medians_ms": [m * 1e3 for m in run["medians"]],
                "round_cpu_ms": [m * 1e3 for m in run["cpu"]],
                "median_ms": median * 1e3,
                "cpu_median_ms": cpu_median * 1e3,
                "samples_per_second": 2 * run["batch"] / median,
                "vs_loop_wall": wall,
                "vs_loop_cpu": cpu,
                "max_weight_diff_vs_loop": diff,
            }
        )
    return rows


if __name__ == "__main__":
    main()
