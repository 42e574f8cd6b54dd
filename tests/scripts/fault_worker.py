"""A tiny deterministic training run that breaks on purpose (tests/train/test_train_faults.py, benchmarks).

Run it under ``rankwise launch``; it trains an MLP on fixed synthetic data through
``DistributedTrainer`` with ``resume="auto"``, step checkpoints and an :class:`AuditLog` in
``OUT``, and rank 0 writes the final parameters to ``OUT/final.pt``. The faults strike on the
first attempt of a launch only (torchrun's restart count), so ``--max-restarts`` recovers:

- ``--kill-rank R --kill-step S``: rank R SIGKILLs itself inside optimizer step S (after the
  micro-batch's backward, before the optimizer step).
- ``--kill-in-save POINT[,POINT...] [--kill-save-index N]``: the writing rank is SIGKILLed at
  POINT of its (N+1)-th checkpoint save (``rankwise.testing.kill_at_checkpoint``); the i-th
  point strikes on attempt i, so one launch can take several.
- ``--stall-rank R --stall-step S``: rank R sleeps forever inside step S.

``--checkpoint-url URL`` checkpoints in object storage instead (the ``AWS_*`` variables reach it).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from pathlib import Path

import torch
from tiny_run import data, mlp_trainer

import rankwise.distributed as rd
from rankwise.testing import kill_at_checkpoint
from rankwise.train import AuditLog, DistributedTrainer, DistributedTrainingConfig
from rankwise.train.checkpoint import set_fault_hook

p = argparse.ArgumentParser()
p.add_argument("out", type=Path)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batch-size", type=int, default=8, help="per rank")
p.add_argument("--every", type=int, default=3, help="checkpoint every N optimizer steps")
p.add_argument("--keep-last", type=int, default=3)
p.add_argument("--kill-rank", type=int, default=-1)
p.add_argument("--kill-step", type=int, default=-1)
p.add_argument("--kill-in-save", default="", help="rankwise.train.FAULT_POINTS names, per attempt")
p.add_argument("--kill-save-index", type=int, default=0)
p.add_argument("--stall-rank", type=int, default=-1)
p.add_argument("--stall-step", type=int, default=-1)
p.add_argument("--checkpoint-url", default="", help="checkpoint_dir (default: OUT/ckpt)")
args = p.parse_args()

config = rd.init()
first_attempt = config.restart_count == 0
rank = rd.get_rank()
args.out.mkdir(parents=True, exist_ok=True)


def fault(trainer: DistributedTrainer, epoch: int, step: int, ids: object) -> None:
    """The trainer's per-micro-batch hook; ``step + 1`` is the optimizer step being built."""
    if not first_attempt:
        return
    if rank == args.kill_rank and step + 1 == args.kill_step:
        (args.out / f"killed-rank{rank}").write_text(f"{time.time()}\n")
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == args.stall_rank and step + 1 == args.stall_step:
        (args.out / f"stalled-rank{rank}").write_text(f"{time.time()}\n")
        while True:  # stops participating: the peers' next collective must time out
            time.sleep(3600)


save_faults = [point for point in args.kill_in_save.split(",") if point]
if config.restart_count < len(save_faults) and rank == 0:  # rank 0 writes the checkpoints
    kill_at_checkpoint(save_faults[config.restart_count], after=args.kill_save_index)
    kill = set_fault_hook(None)
    assert kill is not None

    def record_thread(point: str) -> None:
        """Which thread writes: the kill lands in the background writer unless saves are
        synchronous."""
        marker = args.out / f"save-thread-attempt{config.restart_count}"
        marker.write_text(threading.current_thread().name)
        kill(point)

    set_fault_hook(record_thread)

model, trainer = mlp_trainer([AuditLog(args.out / "audit")])
trainer.on_batch = fault
cfg = DistributedTrainingConfig(
    epochs=args.epochs,
    batch_size=args.batch_size,
    verbose=False,
    checkpoint_every_n_epochs=1,
    checkpoint_every_n_steps=args.every,
    checkpoint_dir=args.checkpoint_url or str(args.out / "ckpt"),
    keep_last_checkpoints=args.keep_last,
    resume="auto",
)
x, y = data()
trainer.fit(x, y, cfg)
if rank == 0:
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(state, args.out / "final.pt")
rd.finalize()
