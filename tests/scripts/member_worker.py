"""One process of tests/distributed/test_distributed_membership.py: joins the job's membership, all-reduces
until a peer is lost, regroups with the survivors and all-reduces once more in the new group.

    python member_worker.py OUT   (RANKWISE_SLOT, WORLD_SIZE, MASTER_ADDR/PORT set by the test)

Writes OUT/slot<s>.json lines: {"pid", "gen", "rank", "world", "sum"} after each group's
all_reduce (the sum of the members' slots + 1).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from rankwise.distributed.config import MemberConfig
from rankwise.distributed.membership import Membership, RegroupError

out = Path(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
cfg = MemberConfig.from_environment()
assert cfg is not None
m = Membership(cfg, timeout_s=60)
m.start()


def record(**extra: object) -> None:
    t = torch.tensor([float(cfg.slot + 1)])
    dist.all_reduce(t)
    line = {
        "pid": os.getpid(),
        "gen": m.generation,
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "sum": t.item(),
        **extra,
    }
    with open(out / f"slot{cfg.slot}.json", "a") as f:
        f.write(json.dumps(line) + "\n")


record()
failed_at = None
while failed_at is None:  # until a peer is lost: the test kills or stops one
    try:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.01)
    except RuntimeError:
        failed_at = time.time()
for _ in range(rounds):
    try:
        m.regroup()
    except RegroupError as exc:
        (out / f"slot{cfg.slot}.error").write_text(str(exc))
        sys.exit(3)
    record(noticed=failed_at, regrouped=time.time())
m.close()
os._exit(0)
