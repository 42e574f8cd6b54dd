"""What the trainer's consistency checks and stall marks cost, against the step they guard.

On 2 gloo CPU ranks, in one run: the median time of a DDP training step of the digits MLP
(64-128-128-10, batch 32 per rank: forward, backward with the gradient all-reduce, SGD step),
next to the median time of what the trainer adds:

- ``Progress.mark`` (once per micro-batch): one ``TCPStore.set`` into the group's store;
- the start-up check (once per ``fit``): hash config, optimizer settings, model signature and
  data length, one all-gather of 32 bytes;
- ``check_parameters_in_sync`` (every ``check_sync_every_n_steps`` steps, off by default).

    PYTHONPATH=src python benchmarks/checks.py
"""

from __future__ import annotations

import platform
import statistics
import time
from typing import Any

import torch
from torch import nn

import rankwise.distributed as rd
import rankwise.parallel as rp
from rankwise.testing import run_distributed
from rankwise.train import DistributedTrainingConfig
from rankwise.train.checks import RANK_LOCAL_FIELDS, optimizer_settings

REPEATS = 200


def _median_ms(fn: Any, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        rd.barrier()  # every rank starts each repeat together: no waiting on a straggler
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def _measure() -> dict[str, float]:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )
    model = rp.wrap_model(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    progress = rd.Progress("benchmark")
    cfg = DistributedTrainingConfig(verbose=False, checkpoint_dir=None)
    config = {k: v for k, v in cfg.to_dict().items() if k not in RANK_LOCAL_FIELDS}

    def start_check() -> None:
        rp.check_consistent(
            {
                "config": config,
                "optimizer": optimizer_settings(opt),
                "model": rp.model_signature(model),
                "dataset_length": 1797,
            }
        )

    for _ in range(20):
        step()  # warm-up
    return {
        "step": _median_ms(step),
        "mark": _median_ms(lambda: progress.mark("the all_reduce of the gradients at step 5")),
        "start": _median_ms(start_check),
        "sync": _median_ms(lambda: rp.check_parameters_in_sync(model)),
    }


def main() -> None:
    torch.set_num_threads(1)
    result = run_distributed(_measure, 2, timeout=300)[0]
    step = result["step"]
    print(
        f"# 2 gloo ranks, {platform.processor() or platform.machine()}, torch {torch.__version__}"
    )
    print("| what | when | median ms | vs one training step |")
    print("| --- | --- | ---: | ---: |")
    rows = (
        ("DDP training step, digits MLP, batch 32/rank (the baseline)", "every step", "step"),
        ("Progress.mark (one store set)", "every micro-batch", "mark"),
        ("start-up check (one 32-byte all-gather)", "once per fit", "start"),
        ("check_parameters_in_sync", "every N steps (opt-in)", "sync"),
    )
    for label, when, key in rows:
        print(f"| {label} | {when} | {result[key]:.4f} | {result[key] / step:.2%} |")


if __name__ == "__main__":
    main()
