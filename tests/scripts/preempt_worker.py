"""A tiny run with background checkpoints for preemption tests (tests/launch/test_launch_continue.py).

Trains tiny_run's MLP under ``rankwise launch`` with an :class:`AuditLog` in ``OUT/audit``,
a step delay, a checkpoint every 3 optimizer steps in ``OUT/ckpt`` and ``resume="auto"``;
each process writes its PID to ``OUT/pids-<slot>``. ``--hold``: the first checkpoint write
is held for a few seconds before its pointer moves, and ``OUT/writing`` says when it is held
(the test then stops the launcher while the loop waits for that write); one epoch of 8 steps; whoever is rank 0 at
the end writes ``OUT/done``. ``--slow-until FILE``: each step takes up to 2 s more while FILE
does not exist (a test's store client gets its turn at the step boundaries before the few
steps left run out).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from tiny_run import data, mlp_trainer

import rankwise.distributed as rd
from rankwise.train import AuditLog, DistributedTrainingConfig
from rankwise.train.checkpoint import set_fault_hook

p = argparse.ArgumentParser()
p.add_argument("out", type=Path)
p.add_argument("--hold", action="store_true")
p.add_argument("--slow-until", type=Path)
args = p.parse_args()
args.out.mkdir(parents=True, exist_ok=True)
slot = os.environ.get("RANKWISE_SLOT", os.environ.get("RANK", "0"))
with open(args.out / f"pids-{slot}", "a") as f:
    f.write(f"{os.getpid()}\n")


def hold(point: str) -> None:
    """The writer thread: hold the first save before its pointer moves."""
    marker = args.out / "writing"
    if point == "before-pointer" and not marker.exists():
        marker.write_text(f"{time.time()}\n")
        time.sleep(4.0)


class Slow:
    def on_batch(self, trainer: object, epoch: int, step: int, ids: object) -> None:
        time.sleep(0.1)
        until = time.monotonic() + 2.0
        while args.slow_until and not args.slow_until.exists() and time.monotonic() < until:
            time.sleep(0.05)


if args.hold:
    set_fault_hook(hold)
x, y = data()
model, trainer = mlp_trainer([Slow(), AuditLog(args.out / "audit")])
cfg = DistributedTrainingConfig(
    epochs=1,
    batch_size=8,
    verbose=False,
    checkpoint_dir=str(args.out / "ckpt"),
    checkpoint_every_n_steps=3,
    resume="auto",
)
trainer.fit(x, y, cfg)
if rd.is_master():
    (args.out / "done").write_text(f"{trainer.state.step}\n")
rd.finalize()
