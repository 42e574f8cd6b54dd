"""One process of tests/distributed/test_distributed_membership.py: joins the job's membership, all-reduces
until a peer is lost, regroups with the survivors and all-reduces once more in the new group.

    python member_worker.py OUT [ROUNDS]   (RANKWISE_SLOT, WORLD_SIZE, MASTER_ADDR/PORT set by the test)

Writes OUT/slot<s>.json lines: {"pid", "gen", "rank", "world", "sum"} after each group's
all_reduce (the sum of the members' slots + 1). ROUNDS (1): the regroups after the first
lost peer; 0: exit after the first group's line. A regroup whose group did not form (a member
lost in its set-up: GroupSetupError) is followed by another, as the trainer's recovery does.

``SETUP_FAULT=GEN:SIGNAL`` (KILL or STOP): this process signals itself as it enters generation
GEN's group set-up (its arrival, the member list and any ready mark written, the others in
gloo's rendezvous waiting for its address), writing OUT/fault-<s> (its time) first.
``SETUP_FAULT=GEN:SLOW``: alive but slow, it sleeps 1 s past four times RANKWISE_SETUP_TIMEOUT_S
(past the doubled retry too) before each group set-up from generation GEN on (a group that
cannot form with every member there).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from setup_fault import on_group_setup

from rankwise.distributed.config import MemberConfig
from rankwise.distributed.membership import GroupSetupError, Membership, RegroupError

out = Path(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
cfg = MemberConfig.from_environment()
assert cfg is not None
m = Membership(cfg, timeout_s=60)

if fault := os.environ.get("SETUP_FAULT"):
    fault_gen, fault_signal = fault.split(":")

    def setup_fault() -> None:
        if fault_signal == "SLOW" and m.generation >= int(fault_gen):
            time.sleep(4 * cfg.setup_timeout_s + 1)
        elif m.generation == int(fault_gen):
            (out / f"fault-{cfg.slot}").write_text(f"{time.time()}\n")
            os.kill(os.getpid(), getattr(signal, f"SIG{fault_signal}"))

    on_group_setup(setup_fault)

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
if rounds == 0:
    m.close()
    os._exit(0)
failed_at = None
while failed_at is None:  # until a peer is lost: the test kills or stops one
    try:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.01)
    except RuntimeError:
        failed_at = time.time()
for _ in range(rounds):
    try:
        while True:
            try:
                m.regroup()
                break
            except GroupSetupError:
                continue  # a member lost in the new group's set-up: without it, then
    except RegroupError as exc:
        (out / f"slot{cfg.slot}.error").write_text(str(exc))
        sys.exit(3)
    record(noticed=failed_at, regrouped=time.time())
m.close()
os._exit(0)
