"""A group a script built with ``torch.distributed`` itself is adopted by ``rd.init()``."""

from __future__ import annotations

import pytest

import rankwise.distributed as rd
from rankwise.distributed import DistributedConfig, DistributedStateError
from rankwise.distributed.group import adopted_local_rank
from rankwise.testing import free_port, run_distributed


def _adopt_a_torch_group(port: int) -> tuple[int, int, str, bool]:
    import os

    import torch.distributed as dist

    rank = int(os.environ.pop("RANK"))
    os.environ.pop("WORLD_SIZE")
    os.environ.pop("LOCAL_RANK")
    # A framework's own init, with no rank variables left in the environment:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    dist.barrier()  # torch's init lets rank 0 leave (and close its store) before rank 1 is done
    cfg = rd.init()
    # No LOCAL_RANK and a gloo group: the local rank is unknown, never taken from the rank.
    try:
        local = str(rd.get_local_rank())
    except DistributedStateError as exc:
        local = "unknown" if "LOCAL_RANK" in str(exc) else str(exc)
    rd.finalize()  # an adopted group belongs to the script that built it
    still_there = dist.is_initialized()
    dist.destroy_process_group()  # ... which can destroy it itself, without an error
    return cfg.rank, cfg.world_size, local, still_there


def test_a_torch_group_is_adopted_with_its_own_rank() -> None:
    results = run_distributed(_adopt_a_torch_group, 2, args=(free_port(),), init_group=False)
    assert results == [(0, 2, "unknown", True), (1, 2, "unknown", True)]


@pytest.mark.parametrize(
    ("backend", "env_local", "cuda_device", "local"),
    [
        ("nccl", None, 1, 1),  # the GPU the script chose, not the global rank
        ("nccl", 3, 0, 0),  # rank 4 on a second machine: GPU 0, whatever a variable says
        ("cpu:gloo,cuda:nccl", None, 2, 2),
        ("gloo", 1, None, 1),  # the launcher's variable
        ("gloo", None, None, None),  # unknown: get_local_rank() then refuses
    ],
)
def test_an_adopted_group_never_takes_its_global_rank_for_the_local_rank(
    backend: str, env_local: int | None, cuda_device: int | None, local: int | None
) -> None:
    assert adopted_local_rank(backend, env_local, cuda_device) == local


def _adopt_with_conflicting_config() -> str:
    try:
        rd.init(DistributedConfig(rank=0, world_size=3))
    except DistributedStateError as exc:
        return str(exc)
    return "no error"


def test_adopting_refuses_a_config_that_contradicts_torch() -> None:
    messages = run_distributed(_adopt_with_conflicting_config_after_torch_init, 2, init_group=False)
    assert all("already initialised as rank" in m and "rank 0 of 3" in m for m in messages)


def _adopt_with_conflicting_config_after_torch_init() -> str:
    import torch.distributed as dist

    dist.init_process_group("gloo")  # from the harness's RANK / WORLD_SIZE / MASTER_* variables
    dist.barrier()  # torch's init lets rank 0 leave (and close its store) before rank 1 is done
    return _adopt_with_conflicting_config()
