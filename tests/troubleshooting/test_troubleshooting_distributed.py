"""docs/troubleshooting.md's rows for rankwise.distributed (DistributedConfig fields, cluster
variables, rendezvous, collectives, Progress, groups built with torch), each provoked in this
process or, where the error needs peers, on 2 gloo ranks (two spawned runs for all).
tests/troubleshooting/test_troubleshooting.py checks that these rows and triggers pair up."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from torch import nn

import rankwise.distributed as rd
import rankwise.parallel as rp
from helpers.troubleshooting_table import check_row, raised, run_cases
from rankwise.distributed import DistributedConfig
from rankwise.testing import free_port, run_distributed

# srun started this task (SLURM_STEP_ID), MASTER_ADDR is set, the port is not.
_SLURM = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_LOCALID": "0"}


def _from_environment(**variables: str) -> BaseException:
    return raised(DistributedConfig.from_environment, variables)


def _master_addr_elsewhere() -> BaseException:
    """Rank 0 told to host the store at an address that is not this machine's."""
    cfg = DistributedConfig(
        rank=0, world_size=2, master_addr="10.255.255.1", master_port=free_port(), timeout_ms=1000
    )
    return raised(rd.init, cfg)


# -- on 2 ranks --------------------------------------------------------------------------------


def _on_ranks(case: str) -> BaseException:
    """Errors that need peers, from rank 1 (every rank raises)."""
    kind, message = _rank_errors()[case]
    return type(kind, (Exception,), {})(message)  # a stand-in with the same type name


@functools.cache
def _rank_errors() -> dict[str, tuple[str, str]]:
    errors = dict(run_distributed(_rank_cases, 2, timeout=90)[1])
    errors.update(run_distributed(_torch_group_cases, 2, timeout=90, init_group=False)[1])
    return errors


def _rank_cases() -> dict[str, tuple[str, str]]:
    return run_cases(
        {
            "weights_zero": lambda: rd.reduce_metrics({"loss": float("nan")}, weight=0),
            "dp_on_ranks": lambda: rp.wrap_model(nn.Linear(2, 2), strategy="dp"),
        }
    )


def _torch_group_cases() -> dict[str, tuple[str, str]]:
    """A group the script built with torch from arguments, not from the launcher variables."""
    rank, world = int(os.environ.pop("RANK")), int(os.environ.pop("WORLD_SIZE"))
    os.environ.pop("LOCAL_RANK")
    address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
    try:
        return run_cases(
            {
                "local_rank_unknown": rd.get_local_rank,
                "adopt_other_world": lambda: rd.init(DistributedConfig(rank=rank, world_size=4)),
            }
        )
    finally:
        dist.destroy_process_group()


TRIGGERS: dict[str, Callable[[], BaseException]] = {
    "config-field-type": lambda: raised(DistributedConfig, rank="1", world_size=2),
    "local-rank-negative": lambda: raised(DistributedConfig, local_rank=-1),
    "master-addr-empty": lambda: raised(DistributedConfig, master_addr=""),
    "slurm-no-master-port": lambda: _from_environment(**_SLURM, MASTER_ADDR="node01"),
    "slurm-nodelist-empty": lambda: _from_environment(**_SLURM, SLURM_JOB_NODELIST=","),
    "master-addr-not-this-machine": _master_addr_elsewhere,
    "collective-op": lambda: raised(rd.all_reduce, torch.ones(1), "avg"),
    "all-gather-list": lambda: raised(rd.all_gather, [torch.ones(1)] * 2, torch.ones(1)),
    "scatter-list": lambda: raised(rd.scatter, torch.ones(1)),
    "collective-src": lambda: raised(rd.broadcast, torch.ones(1), src=1),
    "reduce-metrics-weight": lambda: raised(rd.reduce_metrics, {"loss": 0.5}, weight=-1),
    "reduce-metrics-weights-zero": lambda: _on_ranks("weights_zero"),
    "progress-name": lambda: raised(rd.Progress, ""),
    "wrap-dp-on-ranks": lambda: _on_ranks("dp_on_ranks"),
    "torch-group-local-rank": lambda: _on_ranks("local_rank_unknown"),
    "torch-group-other-world": lambda: _on_ranks("adopt_other_world"),
}


@pytest.mark.parametrize("row_id", sorted(TRIGGERS))
def test_documented_message_is_the_one_raised(row_id: str) -> None:
    check_row(row_id, TRIGGERS[row_id])
