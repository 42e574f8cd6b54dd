"""A small DDP job for launcher tests and scripts/stress_launch.py.

Each rank joins the group, checks one all_reduce, runs a few DDP steps and prints one line.
Flags make it fail in the ways the launcher must handle: a rank raising, a failed first
attempt (for --max-restarts), one failure job-wide on whichever node runs rank 1 (for
two-agent restarts), exiting without finalize(), rank 0 leaving right after init.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import rankwise.distributed as rd

p = argparse.ArgumentParser()
p.add_argument(
    "--init",
    choices=["rankwise", "torch", "adopt"],
    default="rankwise",
    help="adopt: torch's init_process_group, then rankwise.distributed.init() adopts the group",
)
p.add_argument("--fail-attempts", type=int, default=0, help="rank 1 raises on attempts below this")
p.add_argument(
    "--fail-once",
    metavar="PATH",
    help="the first rank-1 process to start raises before init() and creates PATH; none after",
)
p.add_argument("--raise-on-rank", type=int, default=-1)
p.add_argument("--no-finalize", action="store_true")
p.add_argument("--rank0-exits-after-init", action="store_true", help="os._exit(0) on rank 0")
p.add_argument("--steps", type=int, default=3)
p.add_argument("--echo", default="")
args = p.parse_args()

attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
if args.fail_once and os.environ.get("RANK") == "1":
    try:
        open(args.fail_once, "x").close()  # exclusive: exactly one process fails, job-wide
    except FileExistsError:
        pass
    else:
        # Before init(): rank 0 is left waiting in the rendezvous, so its node restarts by
        # membership change (TORCHELASTIC_RESTART_COUNT stays 0 there, becomes 1 here).
        raise RuntimeError(f"planned failure of rank 1 before init, node restart {attempt}")
if args.init == "rankwise":
    rd.init()
else:
    dist.init_process_group("gloo")
    if args.init == "adopt":
        assert rd.init().world_size == dist.get_world_size()
rank, world = dist.get_rank(), dist.get_world_size()
if args.fail_once:
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])  # per node: may differ by rank
if args.rank0_exits_after_init:
    if rank == 0:
        os._exit(0)  # at once: the store rank 0 hosts goes with it
    print(f"rank {rank}/{world}: ok", flush=True)
    raise SystemExit(0)

total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
expected = world * (world + 1) / 2
if total.item() != expected:
    raise SystemExit(f"all_reduce gave {total.item()}, expected {expected}")

if rank == 1 and attempt < args.fail_attempts:
    raise RuntimeError(f"planned failure of rank 1 on attempt {attempt}")
if rank == args.raise_on_rank:
    raise ValueError(f"boom from rank {rank}")

torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    opt.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()

print(f"rank {rank}/{world} attempt {attempt}: ok {args.echo}", flush=True)
if not args.no_finalize:
    if args.init in ("rankwise", "adopt"):
        rd.finalize()
    else:
        dist.destroy_process_group()
