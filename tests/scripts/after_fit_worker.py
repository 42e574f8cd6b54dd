"""Work after training under ``rankwise launch`` (tests/launch/test_launch_continue.py).

Every rank joins the group and checks one all-reduce (training over, which it tells the launcher
with ``rd.mark_training_finished()``); then rank 0 alone keeps
working for ``--rank0-seconds`` (a test set, an export) and writes ``OUT/final`` with its
result, while the other ranks exit 0 at once.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import rankwise.distributed as rd

p = argparse.ArgumentParser()
p.add_argument("out", type=Path)
p.add_argument("--rank0-seconds", type=float, default=0.0)
args = p.parse_args()

rd.init()
total = rd.all_reduce(torch.ones(1)).item()
rd.mark_training_finished()  # the training of this loop of its own is over (continue mode)
if rd.is_master():
    time.sleep(args.rank0_seconds)
    (args.out / "final").write_text(f"{total:g}\n")
