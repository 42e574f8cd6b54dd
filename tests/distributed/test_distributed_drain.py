"""The exit drain: gloo's threads get the GIL before the interpreter finalises.

They outlive ``destroy_process_group`` and may still be freeing Python objects when the main
thread exits; a process that finalises under them dies on SIGABRT. rankwise drains them at
exit, also when the script built its group with torch directly (the seed guides' ``mp.spawn``
examples), which never reaches the hook ``init()`` registers, or reaches it with the group
already destroyed by the script.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rankwise.testing import child_env, run_isolated

SCRIPT = """
import logging, sys
import torch
import torch.distributed as dist
import rankwise.compat.frameworm  # a guide's import: rankwise.distributed comes with it
from rankwise.distributed.drain import gloo_threads_alive
logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")
print("before", gloo_threads_alive())
if sys.argv[1] == "init-first":  # rd.init() in a world of one (no group), as a trainer does
    import rankwise.distributed as rd
    rd.init()
if sys.argv[1] != "none":
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
    if sys.argv[1] == "adopt":  # rd.init() adopts the script's group (DistributedTrainer does)
        import rankwise.distributed as rd
        rd.init()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
    model(torch.ones(1, 3)).sum().backward()
    del model
    print("live", gloo_threads_alive())
    dist.destroy_process_group()
    print("destroyed", gloo_threads_alive())
"""
DRAINED = "rankwise.distributed.drain: giving the process group's threads 50 ms to finish"


def run(tmp_path: Path, mode: str) -> tuple[list[str], str]:
    proc = run_isolated(
        [sys.executable, "-c", SCRIPT, mode, str(tmp_path / "store")], env=child_env(), timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines(), proc.stderr


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["torch-only", "adopt", "init-first"])
def test_a_group_built_with_torch_is_drained_at_exit(tmp_path: Path, mode: str) -> None:
    # torch-only: the script never calls rankwise (only imports it); adopt / init-first: it
    # also called rd.init(), whose own exit hook then finds no live group to destroy.
    out, err = run(tmp_path, mode)
    # The threads appear with the group and, once DDP ran, are still there after
    # destroy_process_group (torch keeps the group alive) ...
    assert out == ["before False", "live True", "destroyed True"]
    # ... so the hook registered on import gives them the GIL, once, before finalisation.
    assert err.count(DRAINED) == 1, err[-3000:]


@pytest.mark.timeout(150)
def test_no_drain_without_a_group(tmp_path: Path) -> None:
    out, err = run(tmp_path, "none")
    assert out == ["before False"]
    assert DRAINED not in err  # a script that only imported rankwise exits at once
