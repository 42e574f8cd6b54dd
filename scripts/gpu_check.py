"""Check rankwise.distributed on a real GPU: the NCCL paths that CPU CI cannot reach.

Run on a machine with CUDA (one GPU is enough; more ranks if it has more):

  torchrun --nproc-per-node 1 scripts/gpu_check.py
  python -m rankwise.cli launch --nproc-per-node 2 scripts/gpu_check.py

Each check prints one ``PASS name`` or ``FAIL name: why`` line per rank; the exit code is the
number of failed checks (0 when all pass). Checks:

  init-auto        backend "auto" resolves to "cpu:gloo,cuda:nccl" and a group exists (also
                   for a world of one started by a launcher)
  device-bound     the group is bound to cuda:LOCAL_RANK (device_id) and it is the current
                   device; rankwise.distributed.device() agrees
  cpu-all-reduce   a CPU tensor all_reduces (over gloo) under the NCCL job
  cuda-all-reduce  a CUDA tensor all_reduces (over NCCL)
  reduce-metrics   rankwise.distributed.reduce_metrics gives the weighted mean
  ddp-bf16-step    rankwise.parallel.wrap_model (DDP) + one bf16 autocast training step;
                   parameters stay equal across ranks
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import torch
import torch.distributed as dist

import rankwise.distributed as rd

failures = 0


def check(name: str, fn: Callable[[], None]) -> None:
    global failures
    try:
        fn()
    except Exception as exc:  # a check reports, the next one still runs
        failures += 1
        detail = traceback.format_exc(limit=2).strip().splitlines()[-1]
        print(f"[rank {rd.get_rank()}] FAIL {name}: {exc!r} ({detail})", flush=True)
    else:
        print(f"[rank {rd.get_rank()}] PASS {name}", flush=True)


def init_auto() -> None:
    cfg = rd.init()
    assert torch.cuda.is_available(), "no CUDA device: run this on a GPU machine"
    assert rd.get_backend() == "cpu:gloo,cuda:nccl", rd.get_backend()
    assert dist.is_initialized(), "no torch group (a launcher's world of one must have one)"
    assert cfg.launched, f"not started by a launcher: {cfg.environment}"


def device_bound() -> None:
    local = int(os.environ["LOCAL_RANK"])
    expected = torch.device("cuda", local)
    bound = dist.distributed_c10d._get_default_group().bound_device_id
    assert bound == expected, f"group bound to {bound}, expected {expected}"
    assert torch.cuda.current_device() == local, torch.cuda.current_device()
    assert rd.device() == expected, rd.device()


def cpu_all_reduce() -> None:
    t = torch.tensor([float(rd.get_rank() + 1)])
    rd.all_reduce(t)
    world = rd.get_world_size()
    assert t.device.type == "cpu" and t.item() == world * (world + 1) / 2, t


def cuda_all_reduce() -> None:
    t = torch.full((1024,), float(rd.get_rank() + 1), device=rd.device())
    dist.all_reduce(t)
    world = rd.get_world_size()
    assert torch.all(t == world * (world + 1) / 2).item(), t[:4]


def reduce_metrics() -> None:
    rank, world = rd.get_rank(), rd.get_world_size()
    got = rd.reduce_metrics({"loss": float(rank)}, weight=rank + 1)
    expected = sum(r * (r + 1) for r in range(world)) / sum(r + 1 for r in range(world))
    assert abs(got["loss"] - expected) < 1e-9, (got, expected)


def ddp_bf16_step() -> None:
    from rankwise.parallel import wrap_model

    torch.manual_seed(0)
    device = rd.device()
    model = wrap_model(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                           torch.nn.Linear(64, 8)).to(device))  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 64, device=device) + rd.get_rank()  # different data per rank
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(rd.get_world_size())]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(gathered[0], g) for g in gathered), "parameters differ across ranks"
    assert torch.isfinite(flat).all().item(), "non-finite parameters after the step"


if __name__ == "__main__":
    check("init-auto", init_auto)
    if dist.is_initialized():
        for name, fn in [
            ("device-bound", device_bound),
            ("cpu-all-reduce", cpu_all_reduce),
            ("cuda-all-reduce", cuda_all_reduce),
            ("reduce-metrics", reduce_metrics),
            ("ddp-bf16-step", ddp_bf16_step),
        ]:
            check(name, fn)
    rd.finalize()
    print(f"[rank {rd.get_rank()}] {'PASS' if failures == 0 else 'FAIL'} all ({failures} failed)")
    sys.exit(failures)
