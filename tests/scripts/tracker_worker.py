"""A tiny run that logs to the experiment trackers (tests/integrations/test_integrations_trackers.py).

Run it under ``rankwise launch``: it trains tiny_run's MLP (192 samples, batch 8 per rank)
through ``DistributedTrainer`` with ``loggers`` from ``--loggers``, a CSV log in ``OUT/logs`` (a
row per optimizer step), and, with ``--every N``, step checkpoints in ``OUT/ckpt`` and
``resume="auto"``. The trackers are configured by their own variables (``WANDB_MODE``,
``WANDB_DIR``, ``MLFLOW_TRACKING_URI`` ...), which the test sets. Whoever is rank 0 at the end
writes the run ids it holds to ``OUT/run-ids.json``.

- ``--kill-slot S --kill-step K``: slot S (its rank under ``--on-failure restart``) SIGKILLs
  itself in optimizer step K on its first start only, after the micro-batch's backward.
- ``--hold-slot S --hold-step K``: slot S sleeps (2 minutes) there instead, having written
  ``OUT/holding``: its peers wait for it in the next step's all-reduce. Every process writes
  its PID to ``OUT/pid-<slot>``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

from tiny_run import data, mlp_trainer

import rankwise.distributed as rd
from rankwise.train import DistributedTrainer, DistributedTrainingConfig

p = argparse.ArgumentParser()
p.add_argument("out", type=Path)
p.add_argument("--loggers", default="csv,wandb,mlflow")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--every", type=int, default=0, help="checkpoint every N optimizer steps")
p.add_argument("--kill-slot", type=int, default=-1)
p.add_argument("--kill-step", type=int, default=-1)
p.add_argument("--hold-slot", type=int, default=-1)
p.add_argument("--hold-step", type=int, default=-1)
args = p.parse_args()
args.out.mkdir(parents=True, exist_ok=True)
slot = int(os.environ.get("RANKWISE_SLOT", os.environ.get("RANK", "0")))
first_start = (
    os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    and os.environ.get("RANKWISE_INCARNATION", "0") == "0"
)


class Kill:
    def on_batch(self, trainer: DistributedTrainer, epoch: int, step: int, ids: object) -> None:
        if first_start and slot == args.kill_slot and step + 1 == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if slot == args.hold_slot and step + 1 == args.hold_step:
            (args.out / "holding").touch()
            time.sleep(120)


(args.out / f"pid-{slot}").write_text(str(os.getpid()))
rd.init()
model, trainer = mlp_trainer([Kill()])
cfg = DistributedTrainingConfig(
    epochs=args.epochs,
    batch_size=8,
    verbose=False,
    log_dir=str(args.out / "logs"),
    log_every_n_batches=1,
    loggers=args.loggers.split(","),
    checkpoint_dir=str(args.out / "ckpt") if args.every else None,
    checkpoint_every_n_steps=args.every,
    checkpoint_every_n_epochs=1 if args.every else 0,
    resume="auto" if args.every else None,
)
x, y = data()
trainer.fit(x, y, cfg)
if rd.is_master():
    (args.out / "run-ids.json").write_text(json.dumps(trainer.state.trackers))
rd.finalize()
