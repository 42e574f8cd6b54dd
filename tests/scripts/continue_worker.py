"""A tiny deterministic run for ``rankwise launch --on-failure continue`` (tests/test_continue.py).

Trains an MLP on fixed data through ``DistributedTrainer`` (no checkpoints: nothing is read
back from disk) with an :class:`AuditLog` in ``OUT/audit``; whoever is rank 0 at the end writes
the parameters to ``OUT/final.pt`` and each process its PID history to ``OUT/pids-<slot>``.

- ``--kill-slot S --kill-step K``: slot S SIGKILLs itself in optimizer step K, after its
  micro-batch is recorded (its gradient reached the others), on its first start only.
- ``--stop-slot S --stop-step K``: slot S SIGSTOPs itself there instead (frozen).
- ``--await-joiner-step K``: in optimizer step K, a member of a smaller world than it started
  with waits (up to 120 s) until a restarted process asks to join, so the join lands at the
  end of step K however slowly the restarted process starts. A restarted process writes the
  optimizer step of each of its micro-batches to ``OUT/rejoined-<slot>``.
- ``--log-dir D``: the trainer's CSV log there, a row per optimizer step (written by rank 0).
- ``--batch-size B`` (per rank at the start), ``--grad-accum A``: run without the launcher
  (one plain process) with the whole global batch, it trains the same global batches as the
  launched run (the uninterrupted reference for uneven shares).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch

import rankwise.distributed as rd
from rankwise.train import AuditLog, DistributedTrainer, DistributedTrainingConfig

NUM_SAMPLES = 192

p = argparse.ArgumentParser()
p.add_argument("out", type=Path)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batch-size", type=int, default=8, help="per rank, at the start")
p.add_argument("--grad-accum", type=int, default=1)
p.add_argument("--kill-slot", type=int, default=-1)
p.add_argument("--kill-step", type=int, default=-1)
p.add_argument("--stop-slot", type=int, default=-1)
p.add_argument("--stop-step", type=int, default=-1)
p.add_argument("--await-joiner-step", type=int, default=-1)
p.add_argument("--log-dir", type=Path, default=None, help="a CSV row per step there")
args = p.parse_args()
args.out.mkdir(parents=True, exist_ok=True)
slot = int(os.environ.get("RANKWISE_SLOT", os.environ.get("RANK", "0")))
first_start = os.environ.get("RANKWISE_INCARNATION", "0") == "0"
with open(args.out / f"pids-{slot}", "a") as f:
    f.write(f"{os.getpid()}\n")


class Fault:
    """After AuditLog in the callbacks: the micro-batch is on record before the fault."""

    def on_batch(self, trainer: DistributedTrainer, epoch: int, step: int, ids: object) -> None:
        if not first_start:
            with open(args.out / f"rejoined-{slot}", "a") as f:
                f.write(f"{step + 1}\n")
            return
        member = rd.membership()
        if step + 1 == args.await_joiner_step and member and member.world_size < 3:
            deadline = time.monotonic() + 120
            while not member.joiners() and time.monotonic() < deadline:
                time.sleep(0.05)
        if slot == args.kill_slot and step + 1 == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if slot == args.stop_slot and step + 1 == args.stop_step:
            args.stop_step = -1  # once
            os.kill(os.getpid(), signal.SIGSTOP)


g = torch.Generator().manual_seed(0)
x = torch.randn(NUM_SAMPLES, 8, generator=g)
y = (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
trainer = DistributedTrainer(
    model,
    torch.nn.CrossEntropyLoss(),
    torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
    callbacks=[AuditLog(args.out / "audit"), Fault()],
)
cfg = DistributedTrainingConfig(
    epochs=args.epochs,
    batch_size=args.batch_size,
    grad_accum_steps=args.grad_accum,
    verbose=False,
    checkpoint_dir=None,
    log_dir=args.log_dir,
    log_every_n_batches=1,
)
trainer.fit(x, y, cfg)
if rd.is_master():
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(state, args.out / "final.pt")
    (args.out / "final-world").write_text(f"{rd.get_world_size()}\n")
rd.finalize()
